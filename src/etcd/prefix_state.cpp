// SPDX-License-Identifier: Apache-2.0
#include "etcd/prefix_state.hpp"

#include <algorithm>

namespace sluice::etcd::detail {
namespace {

// An over-long key is listed by its first bytes only: it must not be held in full. Other keys are
// listed whole, so that a reader can tell which key of its own the rejected version is.
constexpr std::size_t listed_key_bytes = 256;

}  // namespace

std::size_t prefix_state::apply(std::span<const change> events) {
  const std::int64_t next = revision_ + 1;
  std::size_t applied = 0;
  for (const auto& e : events) {
    if (e.mod_revision < next) continue;  // a resumed watch repeating what was applied
    if (e.kind == change::type::put) {
      put(e);
    } else if (e.key.starts_with(prefix_)) {
      const auto name = e.key.substr(prefix_.size());
      if (auto it = entries_.find(name); it != entries_.end()) entries_.erase(it);
      accept(name);
    }
    revision_ = std::max(revision_, e.mod_revision);
    ++applied;
  }
  return applied;
}

void prefix_state::replace_with(prefix_state&& fresh) {
  fresh.rejected_total_ += rejected_total_;
  fresh.rejected_generation_ = rejected_generation_ + 1;
  *this = std::move(fresh);
}

void prefix_state::put(const change& c) {
  if (!c.key.starts_with(prefix_)) return;  // outside the range asked for: not ours
  const auto name = c.key.substr(prefix_.size());
  if (c.key.size() > limits_.max_key_bytes) {
    return reject(listed(name), c.mod_revision,
                  "key of " + std::to_string(c.key.size()) + " bytes is over max_key_bytes (" +
                      std::to_string(limits_.max_key_bytes) + ")");
  }
  auto it = entries_.find(name);
  if (c.value.size() > limits_.max_value_bytes) {
    if (it != entries_.end()) entries_.erase(it);  // its old value is no longer etcd's
    return reject(name, c.mod_revision,
                  "value of " + std::to_string(c.value.size()) + " bytes is over max_value_bytes (" +
                      std::to_string(limits_.max_value_bytes) + ")");
  }
  if (it == entries_.end()) {
    if (entries_.size() >= limits_.max_keys) {
      return reject(name, c.mod_revision,
                    "the snapshot holds max_keys (" + std::to_string(limits_.max_keys) + ") keys");
    }
    it = entries_.emplace(std::string(name), entry{}).first;
  }
  it->second.value.assign(c.value);
  it->second.create_revision = c.create_revision;
  it->second.mod_revision = c.mod_revision;
  accept(name);
}

std::string_view prefix_state::listed(std::string_view name) const {
  return prefix_.size() + name.size() > limits_.max_key_bytes ? name.substr(0, listed_key_bytes) : name;
}

void prefix_state::reject(std::string_view key, std::int64_t mod_revision, std::string reason) {
  ++rejected_total_;
  auto it = std::find_if(rejected_.begin(), rejected_.end(), [&](const rejected_key& r) { return r.key == key; });
  if (it != rejected_.end()) {
    if (it->mod_revision == mod_revision && it->reason == reason) return;
    it->mod_revision = mod_revision;
    it->reason = std::move(reason);
  } else if (rejected_.size() < max_rejected_listed) {
    rejected_.push_back({.key = std::string(key), .mod_revision = mod_revision, .reason = std::move(reason)});
  } else {
    return;
  }
  ++rejected_generation_;
}

void prefix_state::accept(std::string_view name) {
  if (rejected_.empty()) return;
  const auto key = listed(name);
  auto it = std::find_if(rejected_.begin(), rejected_.end(), [&](const rejected_key& r) { return r.key == key; });
  if (it == rejected_.end()) return;
  rejected_.erase(it);
  ++rejected_generation_;
}

}  // namespace sluice::etcd::detail
