// The check's path through the Redis backend (core.hpp): accepted on the caller's thread, then on
// the strand routed, sent, answered — or sent on by a cluster's redirection, or failed and decided
// by on_error — and the nodes' connection events that decide when checks fail fast.
#include "redis/core.hpp"

#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>
#include <future>

#include "redis/scripts.hpp"
#include "redis/slot.hpp"

namespace sluice::detail {

struct redis_core::reply_box {
  op_ptr o;
  redis_core* core;
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

struct redis_core::batch_box {
  std::vector<op_ptr> ops;
  redis_core* core;
  node* to;
};

redis_core::redis_core(const redis_options& o, std::vector<endpoint> seeds, topology t,
                       std::shared_ptr<const tls_settings> tls, asio::io_context& io,
                       std::unique_ptr<memory_backend> local)
    : options_(o),
      cluster_(t == topology::cluster),
      seeds_(std::move(seeds)),
      io_(io),
      tls_(std::move(tls)),
      strand_(asio::make_strand(io)),
      deadline_timer_(strand_),
      local_(std::move(local)),
      log_(o.error_log_interval),
      refresh_timer_(strand_),
      lease_timer_(strand_) {
  switch (t) {
    case topology::one_server: single_ = make_node(seeds_.front()); break;
    case topology::cluster: slots_.assign(slot_count, nullptr); break;
    case topology::sentinel:
      // Its callback runs on the strand before do_shutdown stops it: `this` is alive.
      sentinel_ = std::make_shared<sentinel_watch>(strand_, seeds_, options_, tls_,
                                                   [this](const endpoint& master) { on_master(master); });
      break;
  }
}

void redis_core::start() {
  asio::post(strand_, [self = shared_from_this()] {
    if (self->sentinel_) return self->sentinel_->start();
    if (!self->cluster_) return self->single_->conn->connect();
    self->start_refresh();  // connects the seeds; the first to answer is asked for the map
  });
}

void redis_core::shutdown() {
  if (strand_.running_in_this_thread() || io_.stopped()) {
    // On a stopped io_context nothing runs the strand, nor can anything run on it meanwhile
    // (destroying the backend while another thread restarts the io_context is not allowed):
    // shut down right here, or the connections and their sockets would never be freed.
    do_shutdown();
    return;
  }
  auto done = std::make_shared<std::promise<void>>();
  auto f = done->get_future();
  asio::post(strand_, [self = shared_from_this(), done] {
    self->do_shutdown();
    done->set_value();
  });
  f.wait();
}

// What prepare() makes, the local fallback's own prepared form of the rule (which keeps the
// fallback's state for as long as the prepared rule is held), and a leased rule's lease table,
// registered for the sweeps and metrics.
result<std::shared_ptr<redis_prepared_rule>> redis_core::prepare(const rule& r, const backend* owner) {
  auto p = prepare_script(r, owner);
  if (!p) return p;
  if (local_) {
    auto l = local_->prepare(r);
    if (!l) return l.error();
    (*p)->local = std::move(*l);
  }
  if (r.lease) {
    std::lock_guard lock(leases_mutex_);
    std::shared_ptr<lease_counters>& counters = lease_counters_[r.name];
    if (!counters) counters = std::make_shared<lease_counters>();
    (*p)->leases = std::make_shared<lease_table>(r, (*p)->call, max_leased_keys, counters);
    (*p)->core = weak_from_this();
    std::erase_if(lease_tables_, [](const auto& t) { return t.expired(); });
    lease_tables_.push_back((*p)->leases);
    asio::post(strand_, [self = shared_from_this()] { self->arm_lease_timer(); });
  }
  return p;
}

redis_prepared_rule::~redis_prepared_rule() {
  if (!leases) return;
  if (auto c = core.lock()) c->return_leases(std::move(leases));
}

result<std::shared_ptr<redis_prepared_rule>> redis_core::prepare_script(const rule& r, const backend* owner) {
  auto call = detail::prepare_script(r);
  if (!call) return call.error();
  auto p = std::make_shared<redis_prepared_rule>(r, owner);
  p->call = std::move(*call);
  return p;
}

// The request is valid (backend::async_check) and its rule prepared here.
void redis_core::async_check(const check_request& req, check_handler handler) {
  const redis_prepared_rule& prepared = prepared_of(req);
  checks_.fetch_add(1, std::memory_order_relaxed);
  if (prepared.leases) {
    prepared.leases->counters().checks.fetch_add(1, std::memory_order_relaxed);
    return check_leased(req, prepared, std::move(handler));
  }
  send_check(req, &prepared, std::move(handler));
}

// A check sent to Redis alone (or in a batch): its op made and posted to the strand.
void redis_core::send_check(const check_request& req, const redis_prepared_rule* prepared, check_handler handler) {
  if (pending_.fetch_add(1, std::memory_order_relaxed) >= options_.max_pending) {
    pending_.fetch_sub(1, std::memory_order_relaxed);
    overloaded_.fetch_add(1, std::memory_order_relaxed);
    if (std::uint64_t n = log_.occurred()) {
      spdlog::warn(
          "sluice redis backend: too many checks waiting (max_pending = {}) ({} error(s) since the last report)",
          options_.max_pending, n);
    }
    handler(failure_decision(req, *prepared));
    return;
  }
  auto o = std::make_shared<op>();
  o->req = req;
  o->rule = prepared;
  o->handler = std::move(handler);
  // The deadline is set when it is sent.
  o->call = evalsha_command(prepared->call, prepared->definition(), o->req, options_.key_prefix, now_us(), -1);
  asio::post(strand_, [self = shared_from_this(), o = std::move(o)]() mutable { self->submit(std::move(o)); });
}

std::size_t op::script() const {
  if (lease) return lease->script();
  return all ? all_script : rule->call.script;
}

// A call's `now`: a test clock's goes in the call; otherwise -1, and the script reads TIME.
std::int64_t redis_core::now_us() const {
  return options_.clock_for_test ? to_ns(options_.clock_for_test->now()) / 1000 : -1;
}

// Each check's command built; then one op per slot (one on a single Redis), each deciding its checks
// as one. The checks are valid (backend::async_check_all) and their rules prepared here.
void redis_core::async_check_all(std::span<const check_request> checks, check_all_handler handler) {
  if (checks.size() == 1 && !exceeds_capacity(checks[0])) {
    // All or nothing over one check is that check: sent as one (never leased, as check_all is
    // not), it goes in a batch as any other check, its rule's parameters shared.
    checks_.fetch_add(1, std::memory_order_relaxed);
    return send_check(checks[0], &prepared_of(checks[0]), [h = std::move(handler)](result<decision> r) {
      if (!r) return h(r.error());
      h(std::vector<decision>{*r});
    });
  }
  auto call = std::make_shared<all_call>();
  call->reqs.assign(checks.begin(), checks.end());
  call->handler = std::move(handler);
  call->out.resize(checks.size());
  bool record = true;
  for (const check_request& req : checks) {
    call->rules.push_back(&prepared_of(req));
    call->never.push_back(exceeds_capacity(req));
    record = record && !call->never.back();
  }
  const std::int64_t now = now_us();
  std::vector<command> commands;
  for (std::size_t i = 0; i < checks.size(); ++i) {
    check_request req = checks[i];
    if (call->never[i]) req.cost = 1;
    const redis_prepared_rule& r = *call->rules[i];
    commands.push_back(evalsha_command(r.call, r.definition(), req, options_.key_prefix, now, -1));
  }
  // The parts, by slot in the order of their first check (a single Redis: slot 0 for all).
  std::vector<std::vector<std::size_t>> parts;
  for (std::size_t i = 0; i < checks.size(); ++i) {
    auto same_slot = [&](const std::vector<std::size_t>& p) {
      return !cluster_ || commands[p.front()].slot == commands[i].slot;
    };
    auto it = std::find_if(parts.begin(), parts.end(), same_slot);
    if (it == parts.end()) {
      parts.push_back({i});
    } else {
      it->push_back(i);
    }
  }
  // No one script sees the keys of several slots: each is first only looked at, and all record
  // only when every check would admit (complete_part sends that second round). A refusal then
  // consumes nothing, unless another call takes a unit between the two rounds.
  const bool two_rounds = record && parts.size() > 1;
  call->looking = two_rounds;
  call->parts_left = parts.size();
  checks_.fetch_add(checks.size(), std::memory_order_relaxed);
  std::vector<command> calls;
  for (const auto& part : parts) {
    std::vector<command> mine;
    std::vector<std::size_t> scripts_of;
    for (std::size_t i : part) {
      mine.push_back(std::move(commands[i]));
      scripts_of.push_back(call->rules[i]->call.script);
    }
    calls.push_back(all_command(mine, scripts_of, record && !two_rounds));
  }
  if (two_rounds) {
    call->part_calls = calls;
    call->part_checks = parts;
  }
  for (std::size_t p = 0; p < parts.size(); ++p) submit_part(call, std::move(calls[p]), std::move(parts[p]));
}

void redis_core::submit_part(const std::shared_ptr<all_call>& call, command c, std::vector<std::size_t> part) {
  auto o = std::make_shared<op>();
  o->all = call;
  o->call = std::move(c);
  o->part = std::move(part);
  if (pending_.fetch_add(1, std::memory_order_relaxed) >= options_.max_pending) {
    overloaded_.fetch_add(1, std::memory_order_relaxed);
    complete_part(o, part_failure(*o));
    return;
  }
  asio::post(strand_, [self = shared_from_this(), o = std::move(o)]() mutable { self->submit(std::move(o)); });
}

redis_backend_stats redis_core::stats() const {
  redis_backend_stats s;
  s.checks = checks_.load(std::memory_order_relaxed);
  s.redis_decisions = redis_decisions_.load(std::memory_order_relaxed);
  s.calls = calls_.load(std::memory_order_relaxed);
  s.timeouts = timeouts_.load(std::memory_order_relaxed);
  s.unavailable = unavailable_.load(std::memory_order_relaxed);
  s.protocol_errors = protocol_errors_.load(std::memory_order_relaxed);
  s.overloaded = overloaded_.load(std::memory_order_relaxed);
  s.fail_open = fail_open_.load(std::memory_order_relaxed);
  s.fail_closed = fail_closed_.load(std::memory_order_relaxed);
  s.local_fallback = local_fallback_.load(std::memory_order_relaxed);
  s.script_reloads = script_reloads_.load(std::memory_order_relaxed);
  s.connects = connects_.load(std::memory_order_relaxed);
  s.circuit_opens = circuit_opens_.load(std::memory_order_relaxed);
  s.redirections = redirections_.load(std::memory_order_relaxed);
  s.retries = retries_.load(std::memory_order_relaxed);
  s.topology_refreshes = topology_refreshes_.load(std::memory_order_relaxed);
  s.masters = masters_.load(std::memory_order_relaxed);
  s.master_switches = master_switches_.load(std::memory_order_relaxed);
  s.pending = pending_.load(std::memory_order_relaxed);
  s.circuit_open = open_circuits_.load(std::memory_order_relaxed) > 0;
  s.out_of_memory = out_of_memory_.load(std::memory_order_relaxed);
  return s;
}

// --- on the strand --------------------------------------------------------------------------------

void redis_core::submit(op_ptr o) {
  if (stopping_) return fail(o, errc::backend_unavailable, "backend is shutting down");
  o->deadline = steady::now() + options_.command_timeout;
  inflight_.push_back(o);
  arm_deadline();
  dispatch(o);
}

// To the node serving the check: the one server, or its slot's master (else it waits for the map).
void redis_core::dispatch(const op_ptr& o) {
  if (o->done) return;
  node* n = route(*o);
  if (n == nullptr) return await_map(o);
  send_to(*n, o, false);
}

void redis_core::send_to(node& n, const op_ptr& o, bool asking) {
  if (n.circuit.is_open()) return fail(o, errc::backend_unavailable, "circuit open for " + n.address);
  if (n.conn->resolving()) {
    // The host name is being resolved: sent once connected, if still within the deadline.
    n.unsent.emplace_back(o, asking);
    return;
  }
  if (!n.conn->open()) {
    if (cluster_) request_refresh();
    return fail(o, errc::backend_unavailable, "not connected to " + n.address);
  }
  if (sentinel_ && !n.ready) {
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

void redis_core::send_one(node& n, const op_ptr& o, bool asking) {
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
  if (!n.conn->send(*text, &redis_core::on_reply, box)) {
    delete box;
    return fail(o, errc::backend_unavailable, "cannot queue the command on the connection to " + n.address);
  }
  ++n.in_flight;
  n.last_sent = steady::now();
  calls_.fetch_add(1, std::memory_order_relaxed);
  o->sent_to = &n;
}

void redis_core::flush_batch(node& n) {
  std::vector<op_ptr> ops = std::move(n.batch);
  n.batch.clear();
  std::erase_if(ops, [](const op_ptr& o) { return o->done; });
  if (!n.conn->open()) {
    for (auto& o : ops) fail(o, errc::backend_unavailable, "not connected to " + n.address);
    return;
  }
  // On a cluster a script's keys must share a slot: one call per slot (each slot's checks in the
  // order they came; checks of different slots touch different keys).
  if (cluster_) {
    std::stable_sort(ops.begin(), ops.end(),
                     [](const op_ptr& a, const op_ptr& b) { return a->call.slot < b->call.slot; });
  }
  for (std::size_t first = 0; first < ops.size();) {
    std::size_t last = first + 1;
    while (last < ops.size() && (!cluster_ || ops[last]->call.slot == ops[first]->call.slot)) ++last;
    send_batch(n, std::vector<op_ptr>(ops.begin() + static_cast<std::ptrdiff_t>(first),
                                      ops.begin() + static_cast<std::ptrdiff_t>(last)));
    first = last;
  }
}

void redis_core::send_batch(node& n, std::vector<op_ptr> ops) {
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
  if (!n.conn->send(text, &redis_core::on_batch_reply, box)) {
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

void redis_core::on_batch_reply(redisReply* reply, void* privdata) {
  std::unique_ptr<batch_box> box(static_cast<batch_box*>(privdata));
  node& n = *box->to;
  --n.in_flight;
  for (auto& o : box->ops) {
    if (o->sent_to == &n) o->sent_to = nullptr;
  }
  box->core->handle_batch_reply(box->ops, n, reply);
}

// Checks that timed out meanwhile (done) keep their places in the reply, and are skipped.
void redis_core::handle_batch_reply(std::vector<op_ptr>& ops, node& n, redisReply* reply) {
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
void redis_core::send_unsent(node& n) {
  auto waiting = std::move(n.unsent);
  n.unsent.clear();
  for (auto& [o, asking] : waiting) {
    if (!o->done) send_to(n, o, asking);
  }
}

void redis_core::on_reply(redisReply* reply, void* privdata) {
  auto* box = static_cast<reply_box*>(privdata);
  op_ptr o = std::move(box->o);
  redis_core* self = box->core;
  node& n = *box->to;
  const bool asking = box->asking;
  delete box;
  --n.in_flight;
  if (o->sent_to == &n) o->sent_to = nullptr;
  self->handle_reply(o, n, reply, asking);
}

void redis_core::handle_reply(const op_ptr& o, node& n, redisReply* reply, bool asking) {
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
    finish_lease(o, n, *reply);
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

// The error replies that say the script did not run and where (or when) to send it: true when the
// check was sent on (or waits to be).
bool redis_core::redirect(const op_ptr& o, node& n, std::string_view msg, bool asking) {
  const reply_error kind = classify_error(msg);
  if (kind == reply_error::noscript) {
    // The node forgot the script (SCRIPT FLUSH, restart, a new node): send its body; EVAL caches it.
    if (o->eval || !n.conn->open()) return false;
    o->eval = true;
    script_reloads_.fetch_add(1, std::memory_order_relaxed);
    send_to(n, o, asking);
    return true;
  }
  if (sentinel_ && (kind == reply_error::readonly || kind == reply_error::loading)) {
    // An old master (now a replica), or one loading its data after a restart: the script did not
    // run. The check waits for the master the sentinels name next.
    redirections_.fetch_add(1, std::memory_order_relaxed);
    n.conn->drop_soon(n.address + " answered " + std::string(msg.substr(0, msg.find(' '))) +
                      ": no longer the master, asking the sentinels");
    await_map(o);
    return true;
  }
  if (!cluster_ || kind == reply_error::other || kind == reply_error::oom) return false;
  if (kind == reply_error::tryagain || kind == reply_error::clusterdown) {
    if (kind == reply_error::clusterdown) request_refresh();
    ++o->retries;
    retries_.fetch_add(1, std::memory_order_relaxed);
    retry_later(o);
    return true;
  }
  if (o->redirects >= max_redirects) return false;
  ++o->redirects;
  switch (kind) {
    case reply_error::moved:
    case reply_error::ask: {
      auto to = parse_redirection(msg, host_of(n.address));
      node* target = to ? node_at(to->address) : nullptr;
      if (target == nullptr) return false;
      redirections_.fetch_add(1, std::memory_order_relaxed);
      if (kind == reply_error::moved) {
        // The slot lives there now; the rest of the map may have moved too.
        slots_[to->slot] = target;
        target->serves = true;
        request_refresh();
      }
      send_to(*target, o, kind == reply_error::ask);
      return true;
    }
    case reply_error::readonly:
      // A replica: an old master after a failover. Where its slots went, the next map says.
      redirections_.fetch_add(1, std::memory_order_relaxed);
      await_map(o);
      return true;
    default: return false;
  }
}

// TRYAGAIN or CLUSTERDOWN: the slot's master after 1, 2, 4, 8, then every 16 ms, until the deadline.
void redis_core::retry_later(const op_ptr& o) {
  const auto wait = std::chrono::milliseconds(1 << std::min(o->retries - 1, 4));
  auto timer = std::make_shared<asio::steady_timer>(strand_, wait);
  timer->async_wait(asio::bind_executor(strand_, [self = shared_from_this(), o, timer](boost::system::error_code) {
    if (self->stopping_) return;
    self->dispatch(o);
  }));
}

// A reply of `n` that decided nothing: a failure of the node, then of the check.
void redis_core::failed_reply(const op_ptr& o, node& n, std::string_view why) {
  node_failed(n, 1);
  fail(o, errc::backend_protocol, why);
}

void redis_core::complete(const op_ptr& o, result<decision> r) {
  o->done = true;
  check_handler h = std::move(o->handler);
  pending_.fetch_sub(1, std::memory_order_relaxed);
  h(std::move(r));
}

void redis_core::fail(const op_ptr& o, errc code, std::string_view why) {
  if (o->done) return;
  switch (code) {
    case errc::backend_timeout: timeouts_.fetch_add(1, std::memory_order_relaxed); break;
    case errc::backend_protocol: protocol_errors_.fetch_add(1, std::memory_order_relaxed); break;
    default: unavailable_.fetch_add(1, std::memory_order_relaxed); break;
  }
  if (!stopping_) {
    if (std::uint64_t n = log_.occurred()) {
      spdlog::warn("sluice redis backend: {} ({} error(s) since the last report)", why, n);
    }
  }
  if (o->all) return complete_part(o, part_failure(*o));
  if (o->lease) return fail_lease(o);
  complete(o, failure_decision(o->req, *o->rule));
}

// A part's decisions go into the call's; the last part to finish answers the call. Thread-safe.
void redis_core::complete_part(const op_ptr& o, result<std::vector<decision>> r) {
  o->done = true;
  pending_.fetch_sub(1, std::memory_order_relaxed);
  all_call& call = *o->all;
  check_all_handler h;
  {
    std::lock_guard lock(call.mutex);
    if (!r) {
      if (!call.failed) call.failed = r.error();
    } else {
      for (std::size_t k = 0; k < o->part.size(); ++k) {
        decision d = (*r)[k];
        const std::size_t i = o->part[k];
        if (call.never[i] && d.source == decision_source::limiter) {
          d.allowed = false;  // looked at with cost 1: no wait admits its own cost
          d.retry_after = never;
        }
        call.out[i] = d;
      }
    }
    if (--call.parts_left != 0) return;
    const bool all_admit = std::all_of(call.out.begin(), call.out.end(), [](const decision& d) { return d.allowed; });
    if (call.looking && !call.failed && all_admit) {
      call.looking = false;  // every slot would admit: now each records
      call.parts_left = call.part_calls.size();
    } else {
      h = std::move(call.handler);
    }
  }
  if (!h) {
    const std::shared_ptr<all_call> held = o->all;
    for (std::size_t p = 0; p < held->part_calls.size(); ++p) {
      command c = held->part_calls[p];
      set_record(c);
      submit_part(held, std::move(c), held->part_checks[p]);
    }
    return;
  }
  if (call.failed) return h(*call.failed);
  h(std::move(call.out));
}

// What on_error decides for a part Redis could not answer: the local fallback decides its checks as
// one, as Redis would have. Thread-safe.
result<std::vector<decision>> redis_core::part_failure(const op& o) {
  const all_call& call = *o.all;
  if (options_.on_error == failure_policy::local) {
    std::vector<check_request> local;
    for (std::size_t i : o.part) {
      check_request r = call.reqs[i];
      r.rule = call.rules[i]->local.get();
      local.push_back(r);
    }
    local_fallback_.fetch_add(o.part.size(), std::memory_order_relaxed);
    auto l = local_->check_all(local);
    if (l) {
      for (decision& d : *l) d.source = decision_source::local_fallback;
    }
    return l;
  }
  std::vector<decision> out;
  for (std::size_t i : o.part) {
    auto d = failure_decision(call.reqs[i], *call.rules[i]);
    if (!d) return d.error();
    out.push_back(*d);
  }
  return out;
}

// What on_error decides for a check Redis could not answer. Thread-safe.
result<decision> redis_core::failure_decision(const check_request& req, const redis_prepared_rule& prepared) {
  const rule& r = req.definition();
  switch (options_.on_error) {
    case failure_policy::allow:
      fail_open_.fetch_add(1, std::memory_order_relaxed);
      return full_capacity_decision(r, decision_source::fail_open);
    case failure_policy::deny: {
      fail_closed_.fetch_add(1, std::memory_order_relaxed);
      decision d;
      d.limit = r.limit.capacity();
      if (r.is_dual_layer()) {
        d.dual_layer = true;
        d.user.limit = r.limit.capacity();
        d.tenant.limit = r.tenant->capacity();
      }
      d.retry_after = std::chrono::seconds(1);
      d.source = decision_source::fail_closed;
      return d;
    }
    case failure_policy::local: {
      local_fallback_.fetch_add(1, std::memory_order_relaxed);
      check_request local_req = req;
      local_req.rule = prepared.local.get();
      auto l = local_->check(local_req);
      if (l) l->source = decision_source::local_fallback;
      return l;
    }
  }
  return error(errc::backend_unavailable, "no failure policy");
}

// --- deadlines ------------------------------------------------------------------------------------

void redis_core::trim_inflight() {
  while (!inflight_.empty() && inflight_.front()->done) inflight_.pop_front();
}

// One timer for all checks: they share one timeout, so inflight_ is in deadline order.
void redis_core::arm_deadline() {
  trim_inflight();
  if (inflight_.empty() || deadline_armed_) return;
  deadline_armed_ = true;
  deadline_timer_.expires_at(inflight_.front()->deadline);
  deadline_timer_.async_wait(asio::bind_executor(strand_, [self = shared_from_this()](boost::system::error_code) {
    self->deadline_armed_ = false;
    if (self->stopping_) return;
    self->expire_due();
  }));
}

void redis_core::expire_due() {
  const auto now = steady::now();
  std::vector<op_ptr> expired;
  while (!inflight_.empty()) {
    op_ptr o = inflight_.front();
    if (!o->done && o->deadline > now) break;
    inflight_.pop_front();
    if (!o->done) expired.push_back(std::move(o));
  }
  // Each node's breaker counts the checks it did not answer in time.
  std::vector<std::pair<node*, std::size_t>> unanswered;
  for (const auto& o : expired) {
    if (o->sent_to == nullptr) continue;  // waiting for a route or a retry: no node's fault
    auto it = std::find_if(unanswered.begin(), unanswered.end(), [&](const auto& e) { return e.first == o->sent_to; });
    if (it == unanswered.end()) {
      unanswered.emplace_back(o->sent_to, 1);
    } else {
      ++it->second;
    }
  }
  // Before completing: a caller woken by this timeout already sees the circuit open.
  for (auto [n, count] : unanswered) node_failed(*n, count);
  for (const auto& o : expired) fail(o, errc::backend_timeout, "no reply within command_timeout");
  std::erase_if(awaiting_map_, [](const op_ptr& o) { return o->done; });
  arm_deadline();
}

// --- nodes ----------------------------------------------------------------------------------------

node_ptr redis_core::make_node(const endpoint& where, connection::peer who) {
  auto n = std::make_shared<node>(strand_, options_);
  node* raw = n.get();
  // The connection's events run on the strand, before do_shutdown or close_node closes it: `this`
  // and the node are alive.
  n->conn = std::make_shared<connection>(
      strand_, where, options_, tls_,
      connection::events{.opened = [this, raw] { send_unsent(*raw); },
                         .ready = [this, raw] { on_node_ready(*raw); },
                         .lost = [this, raw](const std::string& why) { on_node_lost(*raw, why); },
                         .server_time =
                             [this, raw](std::int64_t us) {
                               raw->clock.observe(us, server_clock::local_now_us());
                               send_unsent(*raw);  // what waited for the clock
                             }},
      who);
  n->address = n->conn->address();  // cluster nodes: replaced by the map's spelling
  return n;
}

// The sentinels name `where` as the master: a new one takes the checks not yet sent to the old one
// (waiting for its handshake or its batch's flush), which closes (what it had in flight completes
// as unavailable).
void redis_core::on_master(const endpoint& where) {
  if (stopping_ || (single_ && single_->conn->where() == where)) return;  // the same: its probes reconnect it
  std::vector<std::pair<op_ptr, bool>> unsent;
  if (single_) {
    spdlog::warn("sluice redis backend: the sentinels moved master \"{}\" from {} to {}", options_.master_name,
                 single_->address, address_of(where));
    master_switches_.fetch_add(1, std::memory_order_relaxed);
    unsent = std::move(single_->unsent);
    single_->unsent.clear();
    for (auto& o : single_->batch) unsent.emplace_back(std::move(o), false);
    single_->batch.clear();
    close_node(*single_);
  } else {
    spdlog::info("sluice redis backend: the sentinels name {} as master \"{}\"", address_of(where),
                 options_.master_name);
  }
  single_ = make_node(where, connection::peer::master);
  for (auto& [o, asking] : unsent) awaiting_map_.push_back(o);
  update_ready();
  single_->conn->connect();
}

// No more events, waits or probes; what it still had in flight completes as unavailable.
void redis_core::close_node(node& n) {
  if (n.circuit.close()) open_circuits_.fetch_sub(1, std::memory_order_relaxed);
  n.circuit.stop();
  n.oom_probe_timer.cancel();
  n.conn->close();
  fail_waiting(n, errc::backend_unavailable, "connection to " + n.address + " closed");
}

// What waits on the node without having been sent: for its host name, or for its batch's flush.
void redis_core::fail_waiting(node& n, errc code, const std::string& why) {
  auto unsent = std::move(n.unsent);
  n.unsent.clear();
  for (auto& [o, asking] : unsent) fail(o, code, why);
  auto batch = std::move(n.batch);
  n.batch.clear();
  for (auto& o : batch) fail(o, code, why);
}

void redis_core::on_node_ready(node& n) {
  n.ready = true;
  connects_.fetch_add(1, std::memory_order_relaxed);
  n.circuit.succeeded();
  if (n.circuit.close()) {
    open_circuits_.fetch_sub(1, std::memory_order_relaxed);
    spdlog::info("sluice redis backend: connected to {}; circuit closed", n.address);
  }
  update_ready();
  send_unsent(n);
  if (cluster_ && refresh_wanted_) start_refresh();
  if (sentinel_) {
    auto waiting = std::move(awaiting_map_);
    awaiting_map_.clear();
    for (auto& o : waiting) dispatch(o);
  }
}

// The connection is gone (or never came): fail fast until a probe reconnects.
void redis_core::on_node_lost(node& n, const std::string& why) {
  fail_waiting(n, errc::backend_unavailable, why);
  n.ready = false;
  if (stopping_) return;
  if (std::uint64_t count = log_.occurred()) {
    spdlog::warn("sluice redis backend: {} ({} error(s) since the last report)", why, count);
  }
  open_circuit(n, why);
  update_ready();
  if (cluster_) request_refresh();  // a failover, perhaps: where its slots went, the map says
  if (sentinel_) sentinel_->ask();  // the same: where the master went, the sentinels say
}

// `count` more consecutive failures of the node (checks it did not answer in time, or answered with
// replies that decide nothing). At the threshold the circuit opens and the connection drops (next:
// this may run inside its callbacks); the probe's new connection closes it again.
void redis_core::node_failed(node& n, std::size_t count) {
  if (!n.circuit.failed(count)) return;
  const std::string why = std::to_string(n.circuit.consecutive_failures()) + " consecutive failures";
  open_circuit(n, why);
  n.conn->drop_soon(why);
}

void redis_core::open_circuit(node& n, const std::string& why) {
  if (n.circuit.open()) {
    circuit_opens_.fetch_add(1, std::memory_order_relaxed);
    open_circuits_.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn("sluice redis backend: circuit open ({}); checks follow on_error until {} answers", why, n.address);
    update_ready();
  }
  // A probe is a new connection; its handshake PING closes the circuit. The probe holds the node.
  n.circuit.probe_while_open([self = shared_from_this(), held = n.shared_from_this()] {
    if (!held->conn->open()) held->conn->connect();
  });
}

// While a node refuses scripts for want of memory (OOM), readiness is false, and a probe that is
// refused the same way (command.hpp's oom_probe_command) checks every breaker_probe_interval
// whether memory is back, so readiness returns even with no checks coming.
void redis_core::set_out_of_memory(node& n, bool oom) {
  if (n.out_of_memory == oom) return;  // the common case
  n.out_of_memory = oom;
  update_ready();
  if (oom) {
    if (std::uint64_t count = log_.occurred()) {
      spdlog::warn(
          "sluice redis backend: {} is out of memory (maxmemory): scripts refused, /readyz reports not ready"
          " ({} error(s) since the last report)",
          n.address, count);
    }
    schedule_oom_probe(n.shared_from_this());
  }
}

void redis_core::schedule_oom_probe(const node_ptr& n) {
  if (stopping_) return;
  n->oom_probe_timer.expires_after(options_.breaker_probe_interval);
  n->oom_probe_timer.async_wait(
      asio::bind_executor(strand_, [self = shared_from_this(), n](boost::system::error_code ec) {
        if (ec || self->stopping_ || !n->out_of_memory) return;
        struct probe_box {
          redis_core* core;
          node_ptr n;
        };
        auto* box = new probe_box{self.get(), n};
        auto on_probe = [](redisReply* r, void* privdata) {
          std::unique_ptr<probe_box> b(static_cast<probe_box*>(privdata));
          if (r == nullptr) return;  // the connection went away
          if (r->type != REDIS_REPLY_ERROR) b->core->set_out_of_memory(*b->n, false);
        };
        if (!n->conn->send(oom_probe_command(), on_probe, box)) {
          delete box;  // no connection (closed, or lost: its reconnection's replies will tell)
          return;
        }
        self->schedule_oom_probe(n);
      }));
}

void redis_core::do_shutdown() {
  if (stopping_) return;
  stopping_ = true;
  deadline_timer_.cancel();
  refresh_timer_.cancel();
  lease_timer_.cancel();
  if (sentinel_) sentinel_->stop();
  if (single_) close_node(*single_);  // waiting checks complete with "unavailable"
  for (auto& [address, n] : nodes_) close_node(*n);
  for (auto& o : inflight_) fail(o, errc::backend_unavailable, "backend is shutting down");
  inflight_.clear();
  awaiting_map_.clear();
}

}  // namespace sluice::detail
