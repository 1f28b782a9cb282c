// SPDX-License-Identifier: Apache-2.0
// tests/integration/etcd/watch_recorder.hpp — records what a prefix_watcher delivers, and waits
// (on a condition variable, bounded) until a condition on the watcher holds.
//
//   sluice::testing::recorded_watcher x(sluice::testing::test_options(etcd.endpoint()));
//   ASSERT_TRUE(x.connected());
//   ASSERT_TRUE(x.rec.wait_until([&] { return x.w->entries().contains("a"); }));
//   for (const auto& d : x.rec.deliveries()) ...
//
// Thread-safe.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "sluice/etcd/prefix_watcher.hpp"

namespace sluice::testing {

/// What one delivery said.
struct delivery {
  etcd::update_kind kind;
  std::int64_t revision = 0;
  std::size_t events = 0;
  bool connected = false;
  std::size_t keys = 0;
};

class watch_recorder {
 public:
  etcd::prefix_watcher::callback callback() {
    return [this](const etcd::watch_update& u) {
      std::lock_guard lock(mu_);
      log_.push_back({.kind = u.kind,
                      .revision = u.status.revision,
                      .events = u.events,
                      .connected = u.status.connected,
                      .keys = u.entries.size()});
      changed_.notify_all();
    };
  }

  std::vector<delivery> deliveries() const {
    std::lock_guard lock(mu_);
    return log_;
  }

  /// Checks `condition` now and after each delivery until it holds (true) or `timeout` has passed
  /// (false). The wait is generous: sanitizer builds on a loaded machine.
  template <class Condition>
  bool wait_until(Condition condition, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::unique_lock lock(mu_);
    for (;;) {
      const std::size_t seen = log_.size();
      lock.unlock();
      if (condition()) return true;
      lock.lock();
      // Also every 100 ms: progress notifications move the status without a delivery.
      const auto until = std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(100));
      changed_.wait_until(lock, until, [&] { return log_.size() != seen; });
      if (std::chrono::steady_clock::now() >= deadline) {
        lock.unlock();
        return condition();
      }
    }
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::vector<delivery> log_;
};

/// A watcher with its recorder (declared first: it outlives the watcher that calls it).
struct recorded_watcher {
  watch_recorder rec;
  std::unique_ptr<etcd::prefix_watcher> w;

  explicit recorded_watcher(const etcd::etcd_options& o) {
    auto made = etcd::prefix_watcher::create(o, rec.callback());
    if (!made) throw std::runtime_error(made.error().message);
    w = std::move(*made);
  }
  bool connected() {
    return rec.wait_until([&] { return w->status().connected; });
  }
  bool disconnected() {
    return rec.wait_until([&] { return !w->status().connected; });
  }
  /// Connected and current at `revision`.
  bool at(std::int64_t revision) {
    return rec.wait_until([&] { return w->status().connected && w->status().revision == revision; });
  }
  /// Some attempt failed (the status names why).
  bool failed() {
    return rec.wait_until([&] { return !w->status().last_error.empty(); });
  }
};

/// The test prefix, and a short backoff: a restarted etcd is found again within 0.5 s.
inline etcd::etcd_options test_options(const std::string& endpoint) {
  using namespace std::chrono_literals;
  return {
      .endpoints = {endpoint}, .prefix = "/sluice/", .dial_timeout = 2s, .backoff_base = 50ms, .backoff_cap = 500ms};
}

/// True when every changes delivery is at a higher revision than the delivery before it, and no
/// full read goes back: no event was applied twice.
inline bool revisions_increase(const std::vector<delivery>& log) {
  std::int64_t last = 0;
  for (const auto& d : log) {
    if (d.kind == etcd::update_kind::status) continue;
    if (d.revision < last || (d.kind == etcd::update_kind::changes && d.revision == last)) return false;
    last = d.revision;
  }
  return true;
}

/// Events applied by all the changes deliveries.
inline std::size_t events_in(const std::vector<delivery>& log) {
  std::size_t n = 0;
  for (const auto& d : log) n += d.events;
  return n;
}

/// Deliveries of one kind.
inline std::size_t count_of(const std::vector<delivery>& log, etcd::update_kind kind) {
  std::size_t n = 0;
  for (const auto& d : log) n += d.kind == kind ? 1 : 0;
  return n;
}

}  // namespace sluice::testing
