// SPDX-License-Identifier: Apache-2.0
// Which node serves each slot (topology.hpp).
#include "redis/topology.hpp"

#include <algorithm>

#include "redis/engine.hpp"
#include "redis/slot.hpp"

namespace sluice::detail {

topology::topology(topology_kind k) : kind_(k), slots_(slot_count, nullptr) {}

node* topology::find(const std::string& address) const {
  auto it = nodes_.find(address);
  return it == nodes_.end() ? nullptr : it->second.get();
}

node& topology::add(node_ptr n) {
  node& added = *n;
  nodes_[n->address] = std::move(n);
  return added;
}

node_ptr topology::serve_all(node_ptr n) {
  node_ptr before;
  if (!nodes_.empty()) {
    before = std::move(nodes_.begin()->second);
    nodes_.clear();
  }
  n->serves = true;
  std::fill(slots_.begin(), slots_.end(), n.get());
  nodes_.emplace(n->address, std::move(n));
  return before;
}

void topology::apply(const std::vector<slot_owner>& owners, const std::function<node*(const std::string&)>& node_at) {
  for (auto& [address, n] : nodes_) n->serves = false;
  std::vector<node*> fresh(slot_count, nullptr);
  for (const auto& o : owners) {
    node* n = node_at(o.master);
    if (n == nullptr) continue;
    n->serves = true;
    std::fill(fresh.begin() + o.first, fresh.begin() + o.last + 1, n);
  }
  slots_ = std::move(fresh);
}

void topology::moved(std::uint16_t slot, node& to) {
  slots_[slot] = &to;
  to.serves = true;
}

bool topology::healthy() const {
  if (std::find(slots_.begin(), slots_.end(), nullptr) != slots_.end()) return false;
  return std::all_of(nodes_.begin(), nodes_.end(), [](const auto& e) {
    const node& n = *e.second;
    return !n.serves || n.answers();
  });
}

bool topology::out_of_memory() const {
  return std::any_of(nodes_.begin(), nodes_.end(), [](const auto& e) { return e.second->out_of_memory(); });
}

std::vector<node_ptr> topology::take_idle(const std::function<bool(const node&)>& idle) {
  std::vector<node_ptr> out;
  for (auto it = nodes_.begin(); it != nodes_.end();) {
    if (it->second->serves || !idle(*it->second)) {
      ++it;
      continue;
    }
    out.push_back(std::move(it->second));
    it = nodes_.erase(it);
  }
  return out;
}

std::vector<node_ptr> topology::take_all() {
  std::vector<node_ptr> out;
  for (auto& [address, n] : nodes_) out.push_back(std::move(n));
  nodes_.clear();
  std::fill(slots_.begin(), slots_.end(), nullptr);
  return out;
}

}  // namespace sluice::detail
