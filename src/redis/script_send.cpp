// A script chosen and sent (engine.hpp): a check goes to its node alone, or, while calls are in
// flight there, in one call of the batch script with the checks that arrive meanwhile; EVALSHA,
// or EVAL with the body once the node said NOSCRIPT; its deadline written on the node's clock.
// Then its reply read: a decision, a redirection (slot_routing.cpp), or a failure.
#include <hiredis/hiredis.h>

#include <algorithm>
#include <boost/asio/post.hpp>

#include "redis/engine.hpp"
#include "redis/scripts.hpp"

namespace sluice::detail {

struct engine::reply_box {
  op_ptr o;
  engine* owner;
  node* to;
  bool asking;  // sent after ASKING: a resend to the same node needs it again
};

namespace {

// The deadline on the node's clock: a call it runs later records nothing (scripts.cpp).
std::int64_t node_deadline_us(const node& n, steady::time_point deadline, bool test_clock) {
  if (test_clock) return -1;
  return n.clock.server_us_at(server_clock::local_us(deadline));
}

}  // namespace

struct engine::batch_box {
  std::vector<op_ptr> ops;
  engine* owner;
  node* to;
};

void engine::send_to(node& n, const op_ptr& o, bool asking) {
  if (n.circuit.is_open()) return fail(o, errc::backend_unavailable, "circuit open for " + n.address);
  if (n.conn->resolving()) {
    // The host name is being resolved: sent once connected, if still within the deadline.
    n.unsent.emplace_back(o, asking);
    return;
  }
  if (!n.conn->open()) {
    if (kind_ == topology_kind::cluster) request_refresh();
    return fail(o, errc::backend_unavailable, "not connected to " + n.address);
  }
  if (kind_ == topology_kind::sentinel && !n.ready) {
    // Not before ROLE has said it is the master (the handshake answered): a sentinel may name a
    // replica.
    n.unsent.emplace_back(o, asking);
    return;
  }
  if (!options_.clock_for_test && n.clock.offset_us() == server_clock::unknown && !n.ready) {
    // A new node: sent once its handshake has read its clock, so that it carries a deadline (or,
    // should its TIME be unreadable, once the handshake is done).
    n.unsent.emplace_back(o, asking);
    return;
  }
  if (!asking && !o->alone && options_.max_batch > 1 && n.in_flight > 0) {
    // Calls are in flight: this check waits for the ones arriving meanwhile, to go with them in one
    // call of the batch script, flushed once the handlers queued now have run (no timer). Only
    // checks of one `now` share a call (a test clock's may differ).
    if (!n.batch.empty() && n.batch.front()->call.now_argument() != o->call.now_argument()) flush_batch(n);
    n.batch.push_back(o);
    if (n.batch.size() >= options_.max_batch) return flush_batch(n);
    if (!n.flush_posted) {
      n.flush_posted = true;
      asio::post(strand_, [self = shared_from_this(), held = n.shared_from_this()] {
        held->flush_posted = false;
        if (!self->stopping_) self->flush_batch(*held);
      });
    }
    return;
  }
  send_one(n, o, asking);
}

void engine::send_one(node& n, const op_ptr& o, bool asking) {
  set_deadline(o->call, node_deadline_us(n, o->deadline, options_.clock_for_test != nullptr));
  std::string eval;
  const std::string* text = &o->call.text;
  if (o->eval) {
    // EVAL with the script's body instead of EVALSHA with its hash; the rest is the same.
    eval = eval_command(o->call, scripts()[o->script()].body);
    text = &eval;
  }
  static const std::string asking_command = "*1\r\n$6\r\nASKING\r\n";
  if (asking && !n.conn->send(asking_command, nullptr, nullptr)) {
    return fail(o, errc::backend_unavailable, "cannot queue the command on the connection to " + n.address);
  }
  auto* box = new reply_box{o, this, &n, asking};
  if (!n.conn->send(*text, &engine::on_reply, box)) {
    delete box;
    return fail(o, errc::backend_unavailable, "cannot queue the command on the connection to " + n.address);
  }
  ++n.in_flight;
  n.last_sent = steady::now();
  calls_.fetch_add(1, std::memory_order_relaxed);
  o->sent_to = &n;
}

void engine::flush_batch(node& n) {
  std::vector<op_ptr> ops = std::move(n.batch);
  n.batch.clear();
  std::erase_if(ops, [](const op_ptr& o) { return o->done; });
  if (!n.conn->open()) {
    for (auto& o : ops) fail(o, errc::backend_unavailable, "not connected to " + n.address);
    return;
  }
  // On a cluster a script's keys must share a slot: one call per slot (each slot's checks in the
  // order they came; checks of different slots touch different keys).
  const bool by_slot = topology_.one_slot_a_call();
  if (by_slot) {
    std::stable_sort(ops.begin(), ops.end(),
                     [](const op_ptr& a, const op_ptr& b) { return a->call.slot < b->call.slot; });
  }
  for (std::size_t first = 0; first < ops.size();) {
    std::size_t last = first + 1;
    while (last < ops.size() && (!by_slot || ops[last]->call.slot == ops[first]->call.slot)) ++last;
    send_batch(n, std::vector<op_ptr>(ops.begin() + static_cast<std::ptrdiff_t>(first),
                                      ops.begin() + static_cast<std::ptrdiff_t>(last)));
    first = last;
  }
}

void engine::send_batch(node& n, std::vector<op_ptr> ops) {
  if (ops.size() == 1) return send_one(n, ops.front(), false);
  batch_builder b;
  steady::time_point deadline = ops.front()->deadline;
  for (const auto& o : ops) {
    if (o->all) {
      b.add_group(o->call, o->part.size());
    } else {
      b.add(o->call, o->rule->call.script, o->rule->call.dual ? 2 : 1);
    }
    deadline = std::min(deadline, o->deadline);
  }
  const std::string text = b.text(node_deadline_us(n, deadline, options_.clock_for_test != nullptr));
  auto* box = new batch_box{ops, this, &n};
  if (!n.conn->send(text, &engine::on_batch_reply, box)) {
    delete box;
    for (auto& o : ops)
      fail(o, errc::backend_unavailable, "cannot queue the command on the connection to " + n.address);
    return;
  }
  ++n.in_flight;
  n.last_sent = steady::now();
  calls_.fetch_add(1, std::memory_order_relaxed);
  for (auto& o : ops) o->sent_to = &n;
}

void engine::on_batch_reply(redisReply* reply, void* privdata) {
  std::unique_ptr<batch_box> box(static_cast<batch_box*>(privdata));
  node& n = *box->to;
  --n.in_flight;
  for (auto& o : box->ops) {
    if (o->sent_to == &n) o->sent_to = nullptr;
  }
  box->owner->handle_batch_reply(box->ops, n, reply);
}

// Checks that timed out meanwhile (done) keep their places in the reply, and are skipped.
void engine::handle_batch_reply(std::vector<op_ptr>& ops, node& n, redisReply* reply) {
  if (reply == nullptr) {
    // The script may have run: none of them is sent again.
    for (auto& o : ops) fail(o, errc::backend_unavailable, "connection to " + n.address + " lost");
    return;
  }
  if (reply->type == REDIS_REPLY_ERROR) {
    const std::string_view msg(reply->str, reply->len);
    const reply_error kind = classify_error(msg);
    if (kind == reply_error::oom) set_out_of_memory(n, true);
    if (kind != reply_error::oom && kind != reply_error::other) {
      // The script did not run (a redirection, a migration, a node without it): each check goes
      // again, alone, and takes its own way. A node that forgot the batch script learns it again
      // for the next batches.
      if (kind == reply_error::noscript && n.conn->open()) {
        static const std::string load = [] {
          const std::string& body = scripts()[batch_script].body;
          return "*3\r\n$6\r\nSCRIPT\r\n$4\r\nLOAD\r\n$" + std::to_string(body.size()) + "\r\n" + body + "\r\n";
        }();
        n.conn->send(load, nullptr, nullptr);
        script_reloads_.fetch_add(1, std::memory_order_relaxed);
      }
      for (auto& o : ops) {
        o->alone = true;
        dispatch(o);
      }
      return;
    }
    n.circuit.succeeded();
    for (auto& o : ops) {
      fail(o, errc::backend_protocol, "Redis error from " + n.address + ": " + std::string(msg.substr(0, 200)));
    }
    return;
  }
  set_out_of_memory(n, false);
  if (std::int64_t t = reply_time(*reply); t >= 0) n.clock.observe(t, server_clock::local_now_us());
  if (is_expired_reply(*reply)) {
    n.circuit.succeeded();
    for (auto& o : ops)
      fail(o, errc::backend_timeout, "the checks reached Redis after their deadline; nothing was recorded");
    return;
  }
  // A check_all's group answers for each of its checks, in order.
  std::vector<const prepared_script*> calls;
  calls.reserve(ops.size());
  for (const auto& o : ops) {
    if (!o->all) {
      calls.push_back(&o->rule->call);
      continue;
    }
    for (std::size_t i : o->part) calls.push_back(&o->all->rules[i]->call);
  }
  auto decisions = parse_batch_reply(calls, *reply);
  if (!decisions) {
    node_failed(n, ops.size());
    for (auto& o : ops) fail(o, errc::backend_protocol, decisions.error().message);
    return;
  }
  n.circuit.succeeded();
  std::size_t at = 0;
  for (auto& o : ops) {
    const std::size_t count = o->all ? o->part.size() : 1;
    const auto first = decisions->begin() + static_cast<std::ptrdiff_t>(at);
    at += count;
    if (o->done) continue;
    redis_decisions_.fetch_add(count, std::memory_order_relaxed);
    if (o->all) {
      complete_part(o, std::vector<decision>(first, first + static_cast<std::ptrdiff_t>(count)));
    } else {
      complete(o, *first);
    }
  }
  trim_inflight();
}

// Checks that waited for the host name to resolve go right behind the new connection's handshake;
// those that waited for the node's clock, once its handshake has read it (send_to keeps them
// waiting until then).
void engine::send_unsent(node& n) {
  auto waiting = std::move(n.unsent);
  n.unsent.clear();
  for (auto& [o, asking] : waiting) {
    if (!o->done) send_to(n, o, asking);
  }
}

void engine::on_reply(redisReply* reply, void* privdata) {
  auto* box = static_cast<reply_box*>(privdata);
  op_ptr o = std::move(box->o);
  engine* self = box->owner;
  node& n = *box->to;
  const bool asking = box->asking;
  delete box;
  --n.in_flight;
  if (o->sent_to == &n) o->sent_to = nullptr;
  self->handle_reply(o, n, reply, asking);
}

void engine::handle_reply(const op_ptr& o, node& n, redisReply* reply, bool asking) {
  if (o->done) return;  // timed out already
  if (reply == nullptr) {
    // The connection is going away; its loss is handled (and counted for the breaker) once. The
    // script may have run: the check is never sent again.
    return fail(o, errc::backend_unavailable, "connection to " + n.address + " lost");
  }
  // A reply that decides the check, an error included, shows the node works; one that decides
  // nothing (malformed, or a redirection or retry not followed: past max_redirects, to no usable
  // node) counts for its breaker as a timeout does. One followed counts as what comes of it.
  if (reply->type == REDIS_REPLY_ERROR) {
    const std::string_view msg(reply->str, reply->len);
    if (redirect(o, n, msg, asking)) return;
    std::string why = "Redis error from " + n.address + ": " + std::string(msg.substr(0, 200));
    const reply_error kind = classify_error(msg);
    if (kind != reply_error::other && kind != reply_error::oom) {
      if (o->redirects > 0) why += " (after " + std::to_string(o->redirects) + " redirections)";
      return failed_reply(o, n, why);
    }
    n.circuit.succeeded();
    if (kind == reply_error::oom) set_out_of_memory(n, true);
    return fail(o, errc::backend_protocol, why);
  }
  set_out_of_memory(n, false);
  if (std::int64_t t = reply_time(*reply); t >= 0) n.clock.observe(t, server_clock::local_now_us());
  if (is_expired_reply(*reply)) {
    n.circuit.succeeded();
    return fail(o, errc::backend_timeout, "the check reached Redis after its deadline; nothing was recorded");
  }
  if (o->lease) {
    leases_.answered(o, n, *reply);
    trim_inflight();
    return;
  }
  if (o->all) {
    std::vector<const prepared_script*> calls;
    for (std::size_t i : o->part) calls.push_back(&o->all->rules[i]->call);
    auto decisions = parse_batch_reply(calls, *reply);
    if (!decisions) return failed_reply(o, n, decisions.error().message);
    n.circuit.succeeded();
    redis_decisions_.fetch_add(o->part.size(), std::memory_order_relaxed);
    complete_part(o, std::move(decisions));
    trim_inflight();
    return;
  }
  auto d = parse_reply(o->rule->call, *reply);
  if (!d) return failed_reply(o, n, d.error().message);
  n.circuit.succeeded();
  redis_decisions_.fetch_add(1, std::memory_order_relaxed);
  complete(o, std::move(d));
  trim_inflight();
}

// A reply of `n` that decided nothing: a failure of the node, then of the check.
void engine::failed_reply(const op_ptr& o, node& n, std::string_view why) {
  node_failed(n, 1);
  fail(o, errc::backend_protocol, why);
}

}  // namespace sluice::detail
