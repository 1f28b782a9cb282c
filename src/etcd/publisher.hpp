// SPDX-License-Identifier: Apache-2.0
// src/etcd/publisher.hpp (private) — the watcher's current snapshot and status, and their
// delivery: each change is applied under a lock (for status() and entries() on other threads),
// then handed to the user's callback on the watcher's thread, outside the lock.
//
//   publisher p(prefix, limits, on_update);
//   p.watching("etcd-1:2379", std::move(fresh));   // delivers update_kind::full_read
//   p.changes(events);                 // delivers update_kind::changes when anything was applied
//   p.disconnected("etcd-1:2379", "connection reset");   // delivers update_kind::status
//
// Thread-safe: the mutators are called from the watcher's thread only; the getters from any.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "etcd/prefix_state.hpp"
#include "sluice/etcd/prefix_watcher.hpp"

namespace sluice::etcd::detail {

class publisher {
 public:
  publisher(std::string prefix, state_limits limits, prefix_watcher::callback on_update)
      : prefix_(std::move(prefix)), limits_(limits), state_(prefix_, limits), on_update_(std::move(on_update)) {}

  /// An empty state for a full read to fill.
  prefix_state fresh_state() const { return prefix_state(prefix_, limits_); }

  // --- the watcher's thread only ----------------------------------------------------------------
  /// The revision the snapshot is current at; 0 before the first full read.
  std::int64_t revision() const { return state_.revision(); }
  /// A watch is established on `endpoint`, after the full read `fresh` when there is one: the
  /// snapshot is replaced (delivered as full_read) and the status connected (delivered as status
  /// when it was not, and nothing was read).
  void watching(const std::string& endpoint, std::optional<prefix_state> fresh);
  /// One watch response's events (delivered as changes when any was applied).
  void changes(std::span<const change> events);
  /// A progress notification: nothing changed up to `r` (no delivery).
  void progress(std::int64_t r);
  /// The connection to `endpoint` was lost or could not be made, for `why`.
  void disconnected(const std::string& endpoint, const std::string& why);

  // --- any thread -------------------------------------------------------------------------------
  watch_status status() const;
  snapshot entries() const;
  std::pair<snapshot, watch_status> current() const;  // under one lock

 private:
  void sync_locked();  // the status's figures from the state
  void deliver(update_kind kind, std::size_t events);

  const std::string prefix_;
  const state_limits limits_;
  mutable std::mutex mu_;
  // Written on the watcher's thread under mu_; read there without it (no other thread writes).
  prefix_state state_;
  watch_status status_;
  std::uint64_t listed_generation_ = 0;  // of state_.rejected() when status_.rejected was copied
  prefix_watcher::callback on_update_;
};

}  // namespace sluice::etcd::detail
