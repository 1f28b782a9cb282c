// SPDX-License-Identifier: Apache-2.0
// src/etcd/prefix_state.hpp (private) — the keys of one prefix at one revision, within bounds:
// what a full read builds and watch events change. No I/O: the session feeds it.
//
//   prefix_state s("/sluice/", {.max_keys = 100'000, .max_value_bytes = 65'536, .max_key_bytes = 1024});
//   s.load({.key = "/sluice/a", .value = "1", .create_revision = 5, .mod_revision = 7});
//   s.set_revision(9);                    // the full read was at revision 9
//   s.apply(events);                      // one watch response; events at or before 9 are skipped
//
// Not thread-safe.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/etcd/prefix_watcher.hpp"

namespace sluice::etcd::detail {

/// One key as etcd reports it: a kv of a Range, or a watch event.
struct change {
  enum class type { put, erase };
  type kind = type::put;
  std::string_view key;  ///< The whole etcd key, prefix included.
  std::string_view value;
  std::int64_t create_revision = 0;
  std::int64_t mod_revision = 0;  ///< For an erase, the revision of the deletion.
};

struct state_limits {
  std::size_t max_keys = 0;
  std::size_t max_value_bytes = 0;
  std::size_t max_key_bytes = 0;
};

class prefix_state {
 public:
  prefix_state(std::string prefix, state_limits limits) : prefix_(std::move(prefix)), limits_(limits) {}

  /// One kv of a full read, in key order: held if within the bounds, else rejected.
  void load(const change& kv) { put(kv); }
  /// Ends a full read: it was at revision `r`.
  void set_revision(std::int64_t r) { revision_ = r; }
  /// Applies one watch response's events, skipping those at or before `revision()` (already
  /// applied); the revision becomes the latest applied event's. Returns how many were applied.
  std::size_t apply(std::span<const change> events);
  /// A progress notification: no change of the prefix up to `r`.
  void advance_to(std::int64_t r) { revision_ = std::max(revision_, r); }
  /// Takes a full read's keys and revision; the count of rejections carries on.
  void replace_with(prefix_state&& fresh);

  const snapshot& entries() const { return entries_; }
  std::int64_t revision() const { return revision_; }
  std::uint64_t rejected_total() const { return rejected_total_; }
  const std::vector<rejected_key>& rejected() const { return rejected_; }
  /// Changes whenever `rejected()` does.
  std::uint64_t rejected_generation() const { return rejected_generation_; }

 private:
  void put(const change& c);
  /// A key as rejected_key lists it: without the prefix, cut when it is over max_key_bytes.
  std::string_view listed(std::string_view name) const;
  void reject(std::string_view key, std::int64_t mod_revision, std::string reason);
  void accept(std::string_view name);

  std::string prefix_;
  state_limits limits_;
  snapshot entries_;
  std::int64_t revision_ = 0;
  std::uint64_t rejected_total_ = 0;
  std::vector<rejected_key> rejected_;
  std::uint64_t rejected_generation_ = 0;
};

}  // namespace sluice::etcd::detail
