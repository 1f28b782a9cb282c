// SPDX-License-Identifier: Apache-2.0
// The nodes (node.hpp) as the engine makes them, and what they report: ready, lost; and a master
// named by the sentinels (sentinel.hpp) taking over from the old one.
#include <spdlog/spdlog.h>

#include <boost/asio/post.hpp>

#include "core/log_value.hpp"
#include "redis/engine.hpp"

namespace sluice::detail {

node_ptr engine::make_node(const endpoint& where, connection::peer who) {
  const node_context context{.strand = strand_,
                             .options = options_,
                             .owner = *this,
                             .counters = node_counters_,
                             .log = log_,
                             .one_slot_a_call = topology_.one_slot_a_call()};
  return std::make_shared<node>(
      context,
      [&](connection::events e) {
        return std::make_shared<connection>(strand_, where, options_, tls_, std::move(e), who);
      },
      who);
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
  if (old != nullptr && old->connection().where() == where) return;  // the same: its probes reconnect it
  std::vector<op_ptr> waiting;
  if (old != nullptr) {
    spdlog::warn("event=redis_master_switch master_name={} from={} to={}", log_value(options_.master_name),
                 log_value(old->address), log_value(address_of(where)));
    master_switches_.fetch_add(1, std::memory_order_relaxed);
    waiting = old->take_waiting();
    old->close();
  } else {
    spdlog::info("event=redis_master master_name={} address={}", log_value(options_.master_name),
                 log_value(address_of(where)));
  }
  node_ptr master = make_node(where, connection::peer::master);
  node& now = *master;
  topology_.serve_all(std::move(master));
  for (auto& o : waiting) awaiting_map_.push_back(std::move(o));
  update_ready();
  now.connect();
}

void engine::ready(node&) {
  update_ready();
  if (kind_ == topology_kind::cluster && refresh_wanted_) start_refresh();
  if (kind_ == topology_kind::sentinel) {
    auto waiting = std::move(awaiting_map_);
    awaiting_map_.clear();
    for (auto& o : waiting) dispatch(o);
  }
}

// The connection is gone (or never came): fail fast until a probe reconnects.
void engine::lost(node& n, const std::string& why) {
  if (stopping_) return;
  if (std::uint64_t count = log_.occurred()) {
    spdlog::warn("event=redis_connection_lost error={} errors={}", log_value(why), count);
  }
  n.open_circuit(why);
  update_ready();
  if (kind_ == topology_kind::cluster) request_refresh();  // a failover, perhaps: where its slots went, the map says
  if (kind_ == topology_kind::sentinel) ask_sentinels();   // the same: where the master went, the sentinels say
}

}  // namespace sluice::detail
