// SPDX-License-Identifier: Apache-2.0
// src/redis/topology.hpp — which node serves each hash slot: one Redis server (every slot its
// own), the master Sentinel names (the same, swapped at each switch), or a Redis Cluster's slot map
// (each map read replaces it; MOVED patches a slot until the next). The engine asks it where a
// check goes (route) and whether every slot has a master that answers (healthy); finding the
// servers — reading maps, asking sentinels — is the engine's (slot_routing.cpp, sentinel.hpp).
//
// Strand only (the engine's).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "redis/cluster_topology.hpp"

namespace sluice::detail {

class node;
using node_ptr = std::shared_ptr<node>;

/// Which servers the checks go to.
enum class topology_kind : std::uint8_t {
  one_server,  ///< The one at seeds[0].
  cluster,     ///< A Redis Cluster, discovered from the seeds.
  sentinel,    ///< The master the sentinels at the seeds name.
};

/// Most cluster nodes connected at once (Redis Cluster's own design ceiling is 1,000): a hostile or
/// broken topology cannot make the backend open connections without bound.
inline constexpr std::size_t max_nodes = 1024;

class topology {
 public:
  explicit topology(topology_kind k);

  topology_kind kind() const noexcept { return kind_; }
  /// On a cluster a call's keys share one slot: only one slot's checks share a call.
  bool one_slot_a_call() const noexcept { return kind_ == topology_kind::cluster; }

  /// The node serving `slot`; null while none is known (before the first map or master).
  node* route(std::uint16_t slot) const { return slots_[slot]; }
  /// The node at `address`, if connected.
  node* find(const std::string& address) const;
  /// Room for another node (at most max_nodes).
  bool has_room() const noexcept { return nodes_.size() < max_nodes; }
  /// `n` joins, under n->address, serving no slot yet.
  node& add(node_ptr n);

  /// One server or Sentinel: `n` serves every slot, in place of the node before, which is
  /// returned (null at first).
  node_ptr serve_all(node_ptr n);
  /// One server or Sentinel: the node serving every slot (null before the first master).
  node* only() const { return slots_.front(); }

  /// A cluster's map read: each owner's master serves its range, the node `node_at` gives for its
  /// address (null: an address that does not parse, whose slots stay unknown).
  void apply(const std::vector<slot_owner>& owners, const std::function<node*(const std::string&)>& node_at);
  /// MOVED: `slot` lives on `to` now.
  void moved(std::uint16_t slot, node& to);

  /// Every slot has a master, and each master answers (connected, circuit closed, not out of memory).
  bool healthy() const;
  /// Some node refuses scripts for want of memory.
  bool out_of_memory() const;
  /// The nodes `idle` says may go, among those serving no slot: removed and returned.
  std::vector<node_ptr> take_idle(const std::function<bool(const node&)>& idle);
  /// Every node, removed (shutdown).
  std::vector<node_ptr> take_all();
  const std::map<std::string, node_ptr>& nodes() const noexcept { return nodes_; }

 private:
  topology_kind kind_;
  std::map<std::string, node_ptr> nodes_;  // by address: as configured, or as the cluster names it
  std::vector<node*> slots_;               // the master of each slot; null: unknown
};

}  // namespace sluice::detail
