// The nodes' connection events (engine.hpp): a node made and closed, ready, lost, failing (its
// circuit breaker), out of memory; and a master named by the sentinels (sentinel.hpp) taking over
// from the old one.
#include <hiredis/hiredis.h>
#include <spdlog/spdlog.h>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>

#include "redis/engine.hpp"

namespace sluice::detail {

node_ptr engine::make_node(const endpoint& where, connection::peer who) {
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
void engine::on_master(const endpoint& where) {
  if (stopping_) return;
  for (const auto& weak : followers_) {
    // Each time, not only when it changed: a follower that met READONLY asked for this answer.
    if (auto f = weak.lock()) asio::post(f->strand_, [f, where] { f->on_master(where); });
  }
  node* old = topology_.only();
  if (old != nullptr && old->conn->where() == where) return;  // the same: its probes reconnect it
  std::vector<std::pair<op_ptr, bool>> unsent;
  if (old != nullptr) {
    spdlog::warn("sluice redis backend: the sentinels moved master \"{}\" from {} to {}", options_.master_name,
                 old->address, address_of(where));
    master_switches_.fetch_add(1, std::memory_order_relaxed);
    unsent = std::move(old->unsent);
    old->unsent.clear();
    for (auto& o : old->batch) unsent.emplace_back(std::move(o), false);
    old->batch.clear();
    close_node(*old);
  } else {
    spdlog::info("sluice redis backend: the sentinels name {} as master \"{}\"", address_of(where),
                 options_.master_name);
  }
  node_ptr master = make_node(where, connection::peer::master);
  node& now = *master;
  topology_.serve_all(std::move(master));
  for (auto& [o, asking] : unsent) awaiting_map_.push_back(o);
  update_ready();
  now.conn->connect();
}

// No more events, waits or probes; what it still had in flight completes as unavailable.
void engine::close_node(node& n) {
  if (n.circuit.close()) open_circuits_.fetch_sub(1, std::memory_order_relaxed);
  n.circuit.stop();
  n.oom_probe_timer.cancel();
  n.conn->close();
  fail_waiting(n, errc::backend_unavailable, "connection to " + n.address + " closed");
}

// What waits on the node without having been sent: for its host name, or for its batch's flush.
void engine::fail_waiting(node& n, errc code, const std::string& why) {
  auto unsent = std::move(n.unsent);
  n.unsent.clear();
  for (auto& [o, asking] : unsent) fail(o, code, why);
  auto batch = std::move(n.batch);
  n.batch.clear();
  for (auto& o : batch) fail(o, code, why);
}

void engine::on_node_ready(node& n) {
  n.ready = true;
  connects_.fetch_add(1, std::memory_order_relaxed);
  n.circuit.succeeded();
  if (n.circuit.close()) {
    open_circuits_.fetch_sub(1, std::memory_order_relaxed);
    spdlog::info("sluice redis backend: connected to {}; circuit closed", n.address);
  }
  update_ready();
  send_unsent(n);
  if (kind_ == topology_kind::cluster && refresh_wanted_) start_refresh();
  if (kind_ == topology_kind::sentinel) {
    auto waiting = std::move(awaiting_map_);
    awaiting_map_.clear();
    for (auto& o : waiting) dispatch(o);
  }
}

// The connection is gone (or never came): fail fast until a probe reconnects.
void engine::on_node_lost(node& n, const std::string& why) {
  fail_waiting(n, errc::backend_unavailable, why);
  n.ready = false;
  if (stopping_) return;
  if (std::uint64_t count = log_.occurred()) {
    spdlog::warn("sluice redis backend: {} ({} error(s) since the last report)", why, count);
  }
  open_circuit(n, why);
  update_ready();
  if (kind_ == topology_kind::cluster) request_refresh();  // a failover, perhaps: where its slots went, the map says
  if (kind_ == topology_kind::sentinel) ask_sentinels();  // the same: where the master went, the sentinels say
}

// `count` more consecutive failures of the node (checks it did not answer in time, or answered with
// replies that decide nothing). At the threshold the circuit opens and the connection drops (next:
// this may run inside its callbacks); the probe's new connection closes it again.
void engine::node_failed(node& n, std::size_t count) {
  if (!n.circuit.failed(count)) return;
  const std::string why = std::to_string(n.circuit.consecutive_failures()) + " consecutive failures";
  open_circuit(n, why);
  n.conn->drop_soon(why);
}

void engine::open_circuit(node& n, const std::string& why) {
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
void engine::set_out_of_memory(node& n, bool oom) {
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

void engine::schedule_oom_probe(const node_ptr& n) {
  if (stopping_) return;
  n->oom_probe_timer.expires_after(options_.breaker_probe_interval);
  n->oom_probe_timer.async_wait(
      asio::bind_executor(strand_, [self = shared_from_this(), n](boost::system::error_code ec) {
        if (ec || self->stopping_ || !n->out_of_memory) return;
        struct probe_box {
          engine* owner;
          node_ptr n;
        };
        auto* box = new probe_box{self.get(), n};
        auto on_probe = [](redisReply* r, void* privdata) {
          std::unique_ptr<probe_box> b(static_cast<probe_box*>(privdata));
          if (r == nullptr) return;  // the connection went away
          if (r->type != REDIS_REPLY_ERROR) b->owner->set_out_of_memory(*b->n, false);
        };
        if (!n->conn->send(oom_probe_command(), on_probe, box)) {
          delete box;  // no connection (closed, or lost: its reconnection's replies will tell)
          return;
        }
        self->schedule_oom_probe(n);
      }));
}

}  // namespace sluice::detail
