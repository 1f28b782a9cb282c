// SPDX-License-Identifier: Apache-2.0
// sluice/etcd/prefix_watcher.hpp — every key under one etcd v3 prefix, kept current in memory.
//
// On a thread of its own the watcher connects to an endpoint (trying them in turn), authenticates
// when a username is set, reads the whole prefix at one revision R, then watches it from R + 1.
// Each watch response is applied as one batch and delivered; after a lost connection the watch
// resumes at the next revision, so no change is missed or applied twice. When etcd has compacted
// the revisions it needs, or cancels the watch, it reads the whole prefix again. Between failed
// attempts, and between full reads that follow each other closely, it waits a capped exponential
// backoff with jitter; a full read takes a bounded number of pages. This is the loop of etcd's own Go
// client (clientv3).
//
//   auto w = sluice::etcd::prefix_watcher::create({.endpoints = {"127.0.0.1:2379"}, .prefix = "/sluice/"},
//       [](const sluice::etcd::watch_update& u) {
//         for (const auto& [key, e] : u.entries) use(key, e.value);   // keys without "/sluice/"
//         if (!u.status.connected) log(u.status.last_error);
//       });
//   if (!w) return fail(w.error().message);
//   sluice::etcd::watch_status s = (*w)->status();
//
// Bounded memory: at most `max_keys` keys of at most `max_key_bytes` with values of at most
// `max_value_bytes` (etcd_options); a key over a bound is left out of the snapshot and reported in
// `watch_status::rejected`, never held. A full read holds the old snapshot and the new one until
// the new one is complete. Nothing is queued: each batch is applied, then delivered, before the
// next is read.
//
// Thread-safe: `status()`, `entries()` and `current()` may be called from any thread. The callback runs on the
// watcher's thread, one call at a time; it must not throw, and must not destroy the watcher.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "sluice/error.hpp"
#include "sluice/etcd/options.hpp"

namespace sluice::etcd {

/// One key's value, as etcd holds it.
struct entry {
  std::string value;
  std::int64_t create_revision = 0;  ///< Revision of the key's latest creation.
  std::int64_t mod_revision = 0;     ///< Revision of its latest change.

  bool operator==(const entry&) const = default;
};

/// Every key of the prefix, without the prefix, in byte order.
using snapshot = std::map<std::string, entry, std::less<>>;

/// A key etcd holds under the prefix that the snapshot leaves out.
struct rejected_key {
  std::string key;                ///< Without the prefix; a key over max_key_bytes is cut to its first 256 bytes.
  std::int64_t mod_revision = 0;  ///< The revision of the version left out.
  std::string reason;             ///< e.g. "value of 70000 bytes is over max_value_bytes (65536)".

  bool operator==(const rejected_key&) const = default;
};

/// Most keys `watch_status::rejected` lists.
inline constexpr std::size_t max_rejected_listed = 100;

struct watch_status {
  /// True once a snapshot is current and a watch is established, until the connection is lost.
  bool connected = false;
  /// The etcd revision the snapshot is current at: every change up to it is applied. 0 before
  /// the first full read.
  std::int64_t revision = 0;
  /// The endpoint of the current connection, or of the latest attempt.
  std::string endpoint;
  /// Why the latest connection or attempt failed; kept after a reconnection. Empty until a failure.
  std::string last_error;
  /// Connections that reached an established watch.
  std::uint64_t connects = 0;
  /// Full reads of the prefix: the first, and one after each compaction or canceled watch.
  std::uint64_t full_reads = 0;
  /// Keys left out since the watcher started, counted each time (a put over a bound counts once).
  std::uint64_t rejected_total = 0;
  /// Keys left out now, the first `max_rejected_listed` of them; a key leaves the list when it is
  /// deleted or accepted again. At the key cap, a key stays out until the next full read.
  std::vector<rejected_key> rejected;
};

/// What a delivery is about.
enum class update_kind {
  full_read,  ///< The snapshot was replaced by a full read of the prefix.
  changes,    ///< One watch response's events were applied.
  status,     ///< Only the status changed (connected, disconnected, another error).
};

/// One delivery. The references are valid during the callback only: copy what you keep.
struct watch_update {
  update_kind kind;
  const snapshot& entries;
  const watch_status& status;
  std::size_t events = 0;  ///< Events applied by this update (`changes` only).
};

class prefix_watcher {
 public:
  using callback = std::function<void(const watch_update&)>;

  /// Validates the options (see `validate`), reads the TLS files, and starts the watcher's thread.
  /// An unreachable etcd is not an error: the watcher keeps trying and reports it in the status.
  static result<std::unique_ptr<prefix_watcher>> create(etcd_options options, callback on_update);

  prefix_watcher(const prefix_watcher&) = delete;
  prefix_watcher& operator=(const prefix_watcher&) = delete;
  /// Cancels the call in flight and joins the thread: promptly, whatever it was doing.
  ~prefix_watcher();

  /// The current status (a copy).
  watch_status status() const;
  /// The current snapshot (a copy).
  snapshot entries() const;
  /// The snapshot and the status of one instant (copies): a key is in one or the other's
  /// `rejected`, or deleted.
  std::pair<snapshot, watch_status> current() const;

 private:
  struct impl;
  explicit prefix_watcher(std::unique_ptr<impl> impl);
  std::unique_ptr<impl> impl_;
};

}  // namespace sluice::etcd
