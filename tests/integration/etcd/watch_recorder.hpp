// tests/integration/etcd/watch_recorder.hpp — records what a prefix_watcher delivers, and waits
// (on a condition variable, bounded) until a condition on the watcher holds.
//
//   sluice::testing::watch_recorder rec;                          // outlives the watcher
//   auto w = prefix_watcher::create(options, rec.callback());
//   ASSERT_TRUE(rec.wait_until([&] { return (*w)->entries().contains("a"); }));
//   for (const auto& d : rec.deliveries()) ...
//
// Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <algorithm>
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
