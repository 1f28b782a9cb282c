// SPDX-License-Identifier: Apache-2.0
// One Redis server (node.hpp): a check sent alone or in a batch, and its reply handed back; the
// connection's events; the circuit breaker; the out-of-memory probe.
#include "redis/node.hpp"

#include <hiredis/hiredis.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>

#include "core/log_value.hpp"
#include "redis/cluster_topology.hpp"
#include "redis/command.hpp"
#include "redis/scripts.hpp"

namespace sluice::detail {

struct node::reply_box {
  op_ptr o;
  node* to;
  bool asking;  // sent after ASKING: a resend to the same node needs it again
};

struct node::batch_box {
  std::vector<op_ptr> ops;
  node* to;
};

// The connection's events run on the strand, before close() closes it: the node is alive.
node::node(const node_context& context, const connection_factory& make, connection::peer who)
    : ctx_(context), peer_(who), circuit_(context.strand, context.options), oom_probe_timer_(context.strand) {
  conn_ = make(connection::events{.opened = [this] { send_unsent(); },
                                  .ready = [this] { on_ready(); },
                                  .lost = [this](const std::string& why) { on_lost(why); },
                                  .server_time =
                                      [this](std::int64_t us) {
                                        clock_.observe(us, server_clock::local_now_us());
                                        send_unsent();  // what waited for the clock
                                      }});
  address = conn_->address();
}

void node::send(const op_ptr& o, bool asking) {
  if (circuit_.is_open()) return ctx_.owner.failed(o, errc::backend_unavailable, "circuit open for " + address);
  if (conn_->resolving()) {
    // The host name is being resolved: sent once connected, if still within the deadline.
    unsent_.emplace_back(o, asking);
    return;
  }
  if (!conn_->open()) return ctx_.owner.failed(o, errc::backend_unavailable, "not connected to " + address);
  if (peer_ == connection::peer::master && !ready_) {
    // Not before ROLE has said it is the master (the handshake answered): a sentinel may name a
    // replica.
    unsent_.emplace_back(o, asking);
    return;
  }
  if (!ctx_.options.clock_for_test && clock_.offset_us() == server_clock::unknown && !ready_) {
    // A new connection: sent once its handshake has read the clock, so that it carries a deadline
    // (or, should its TIME be unreadable, once the handshake is done).
    unsent_.emplace_back(o, asking);
    return;
  }
  if (!asking && !o->alone && ctx_.options.max_batch > 1 && in_flight_ > 0) {
    // Calls are in flight: this check waits for the ones arriving meanwhile, to go with them in one
    // call of the batch script, flushed once the handlers queued now have run (no timer). Only
    // checks of one `now` share a call (a test clock's may differ).
    if (!batch_.empty() && batch_.front()->call.now_argument() != o->call.now_argument()) flush_batch();
    batch_.push_back(o);
    if (batch_.size() >= ctx_.options.max_batch) return flush_batch();
    if (!flush_posted_) {
      flush_posted_ = true;
      asio::post(ctx_.strand, [self = shared_from_this()] {
        self->flush_posted_ = false;
        if (!self->closed_) self->flush_batch();
      });
    }
    return;
  }
  send_one(o, asking);
}

// The deadline on the node's clock: a call it runs later records nothing (scripts.cpp).
std::int64_t node::deadline_us(steady::time_point deadline) const {
  if (ctx_.options.clock_for_test) return -1;
  return clock_.server_us_at(server_clock::local_us(deadline));
}

void node::send_one(const op_ptr& o, bool asking) {
  set_deadline(o->call, deadline_us(o->deadline));
  std::string eval;
  const std::string* text = &o->call.text;
  if (o->eval) {
    // EVAL with the script's body instead of EVALSHA with its hash; the rest is the same.
    eval = eval_command(o->call, scripts()[o->script()].body);
    text = &eval;
  }
  static const std::string asking_command = "*1\r\n$6\r\nASKING\r\n";
  if (asking && !conn_->send(asking_command, nullptr, nullptr)) {
    return ctx_.owner.failed(o, errc::backend_unavailable, "cannot queue the command on the connection to " + address);
  }
  auto* box = new reply_box{o, this, asking};
  if (!conn_->send(*text, &node::on_reply, box)) {
    delete box;
    return ctx_.owner.failed(o, errc::backend_unavailable, "cannot queue the command on the connection to " + address);
  }
  ++in_flight_;
  last_sent_ = steady::now();
  ctx_.counters.calls.fetch_add(1, std::memory_order_relaxed);
  o->sent_to = this;
}

void node::flush_batch() {
  std::vector<op_ptr> ops = std::move(batch_);
  batch_.clear();
  std::erase_if(ops, [](const op_ptr& o) { return o->done; });
  if (!conn_->open()) {
    for (auto& o : ops) ctx_.owner.failed(o, errc::backend_unavailable, "not connected to " + address);
    return;
  }
  // On a cluster a script's keys must share a slot: one call per slot (each slot's checks in the
  // order they came; checks of different slots touch different keys).
  const bool by_slot = ctx_.one_slot_a_call;
  if (by_slot) {
    std::stable_sort(ops.begin(), ops.end(),
                     [](const op_ptr& a, const op_ptr& b) { return a->call.slot < b->call.slot; });
  }
  for (std::size_t first = 0; first < ops.size();) {
    std::size_t last = first + 1;
    while (last < ops.size() && (!by_slot || ops[last]->call.slot == ops[first]->call.slot)) ++last;
    send_batch(std::vector<op_ptr>(ops.begin() + static_cast<std::ptrdiff_t>(first),
                                   ops.begin() + static_cast<std::ptrdiff_t>(last)));
    first = last;
  }
}

void node::send_batch(std::vector<op_ptr> ops) {
  if (ops.size() == 1) return send_one(ops.front(), false);
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
  const std::string text = b.text(deadline_us(deadline));
  auto* box = new batch_box{ops, this};
  if (!conn_->send(text, &node::on_batch_reply, box)) {
    delete box;
    for (auto& o : ops) {
      ctx_.owner.failed(o, errc::backend_unavailable, "cannot queue the command on the connection to " + address);
    }
    return;
  }
  ++in_flight_;
  last_sent_ = steady::now();
  ctx_.counters.calls.fetch_add(1, std::memory_order_relaxed);
  for (auto& o : ops) o->sent_to = this;
}

void node::on_reply(redisReply* reply, void* privdata) {
  std::unique_ptr<reply_box> box(static_cast<reply_box*>(privdata));
  node& n = *box->to;
  --n.in_flight_;
  if (box->o->sent_to == &n) box->o->sent_to = nullptr;
  if (reply != nullptr) n.observe(*reply);
  n.ctx_.owner.answered(n, box->o, reply, box->asking);
}

void node::on_batch_reply(redisReply* reply, void* privdata) {
  std::unique_ptr<batch_box> box(static_cast<batch_box*>(privdata));
  node& n = *box->to;
  --n.in_flight_;
  for (auto& o : box->ops) {
    if (o->sent_to == &n) o->sent_to = nullptr;
  }
  if (reply != nullptr) n.observe(*reply);
  n.ctx_.owner.answered_batch(n, box->ops, reply);
}

// What every reply says of the node: a script refused for want of memory, or run (the node has
// memory again), and the server's time.
void node::observe(const redisReply& reply) {
  if (reply.type == REDIS_REPLY_ERROR) {
    if (classify_error({reply.str, reply.len}) == reply_error::oom) set_out_of_memory(true);
    return;
  }
  set_out_of_memory(false);
  if (std::int64_t t = reply_time(reply); t >= 0) clock_.observe(t, server_clock::local_now_us());
}

void node::reload_batch_script() {
  if (!conn_->open()) return;
  static const std::string load = [] {
    const std::string& body = scripts()[batch_script].body;
    return "*3\r\n$6\r\nSCRIPT\r\n$4\r\nLOAD\r\n$" + std::to_string(body.size()) + "\r\n" + body + "\r\n";
  }();
  conn_->send(load, nullptr, nullptr);
  ctx_.counters.script_reloads.fetch_add(1, std::memory_order_relaxed);
}

// Checks that waited for the host name to resolve go right behind the new connection's handshake;
// those that waited for the clock or the handshake, once they are there (send() keeps them waiting
// until then).
void node::send_unsent() {
  auto waiting = std::move(unsent_);
  unsent_.clear();
  for (auto& [o, asking] : waiting) {
    if (!o->done) send(o, asking);
  }
}

std::vector<op_ptr> node::take_waiting() {
  std::vector<op_ptr> out;
  for (auto& [o, asking] : unsent_) out.push_back(std::move(o));
  unsent_.clear();
  for (auto& o : batch_) out.push_back(std::move(o));
  batch_.clear();
  return out;
}

void node::fail_waiting(errc code, const std::string& why) {
  for (auto& o : take_waiting()) ctx_.owner.failed(o, code, why);
}

bool node::idle_for(steady::duration period, steady::time_point now) const noexcept {
  return in_flight_ == 0 && unsent_.empty() && batch_.empty() && now - last_sent_ >= period;
}

void node::on_ready() {
  ready_ = true;
  ctx_.counters.connects.fetch_add(1, std::memory_order_relaxed);
  circuit_.succeeded();
  if (circuit_.close()) {
    ctx_.counters.open_circuits.fetch_sub(1, std::memory_order_relaxed);
    spdlog::info("event=redis_circuit_closed address={} message=\"connected\"", log_value(address));
  }
  send_unsent();
  ctx_.owner.ready(*this);
}

void node::on_lost(const std::string& why) {
  fail_waiting(errc::backend_unavailable, why);
  ready_ = false;
  ctx_.owner.lost(*this, why);
}

void node::failed(std::size_t count) {
  if (!circuit_.failed(count)) return;
  const std::string why = std::to_string(circuit_.consecutive_failures()) + " consecutive failures";
  open_circuit(why);
  conn_->drop_soon(why);
}

void node::open_circuit(const std::string& why) {
  if (circuit_.open()) {
    ctx_.counters.circuit_opens.fetch_add(1, std::memory_order_relaxed);
    ctx_.counters.open_circuits.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn("event=redis_circuit_open address={} reason={} message=\"checks follow on_error until it answers\"",
                 log_value(address), log_value(why));
    ctx_.owner.health_changed(*this);
  }
  // A probe is a new connection; its handshake PING closes the circuit. The probe holds the node.
  circuit_.probe_while_open([held = shared_from_this()] {
    if (!held->conn_->open()) held->conn_->connect();
  });
}

// While the node refuses scripts for want of memory (OOM), it does not answer, and a probe that is
// refused the same way (command.hpp's oom_probe_command) checks every breaker_probe_interval
// whether memory is back, so that readiness returns even with no checks coming.
void node::set_out_of_memory(bool oom) {
  if (out_of_memory_ == oom) return;  // the common case
  out_of_memory_ = oom;
  ctx_.owner.health_changed(*this);
  if (!oom) return;
  if (std::uint64_t count = ctx_.log.occurred()) {
    spdlog::warn(
        "event=redis_out_of_memory address={} errors={} message=\"scripts refused (maxmemory); /readyz reports not "
        "ready\"",
        log_value(address), count);
  }
  schedule_oom_probe();
}

void node::schedule_oom_probe() {
  if (closed_) return;
  oom_probe_timer_.expires_after(ctx_.options.breaker_probe_interval);
  oom_probe_timer_.async_wait(
      asio::bind_executor(ctx_.strand, [self = shared_from_this()](boost::system::error_code ec) {
        if (ec || self->closed_ || !self->out_of_memory_) return;
        auto* box = new node_ptr(self);
        auto on_probe = [](redisReply* r, void* privdata) {
          std::unique_ptr<node_ptr> held(static_cast<node_ptr*>(privdata));
          if (r != nullptr) (*held)->observe(*r);  // null: the connection went away
        };
        if (!self->conn_->send(oom_probe_command(), on_probe, box)) {
          delete box;  // no connection (closed, or lost: its reconnection's replies will tell)
          return;
        }
        self->schedule_oom_probe();
      }));
}

void node::close() {
  if (closed_) return;
  closed_ = true;
  if (circuit_.close()) ctx_.counters.open_circuits.fetch_sub(1, std::memory_order_relaxed);
  circuit_.stop();
  oom_probe_timer_.cancel();
  conn_->close();
  fail_waiting(errc::backend_unavailable, "connection to " + address + " closed");
}

}  // namespace sluice::detail
