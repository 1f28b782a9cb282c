// SPDX-License-Identifier: Apache-2.0
// sluice/testing/simulated_clock.hpp — a clock that moves only when told to.
//
//   sluice::testing::simulated_clock clock;           // starts at time_point{} + 1 s
//   bucket.try_acquire(clock.now(), 1);
//   clock.advance(std::chrono::milliseconds(200));    // wakes sleepers whose deadline passed
//
// Thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>

#include "sluice/clock.hpp"

namespace sluice::testing {

class simulated_clock final : public clock {
 public:
  explicit simulated_clock(time_point start = time_point(std::chrono::seconds(1))) : now_(to_ns(start)) {}

  time_point now() noexcept override { return from_ns(now_.load(std::memory_order_acquire)); }

  bool sleep_until(time_point deadline, std::stop_token stop) override {
    std::unique_lock lock(mu_);
    ++sleepers_;
    bool reached = cv_.wait(lock, stop, [&] { return now() >= deadline; });
    --sleepers_;
    return reached;
  }

  /// Moves time forward by `d` (must be >= 0) and wakes sleepers.
  void advance(nanoseconds d) { set(now() + d); }

  /// Sets the time; a time earlier than now() is ignored (the clock is monotonic).
  void set(time_point t) {
    {
      std::lock_guard lock(mu_);
      std::int64_t target = to_ns(t);
      std::int64_t current = now_.load(std::memory_order_relaxed);
      if (target > current) now_.store(target, std::memory_order_release);
    }
    cv_.notify_all();
  }

  /// Number of threads currently inside sleep_until (for tests that must know a waiter is parked).
  std::size_t sleepers_for_test() {
    std::lock_guard lock(mu_);
    return sleepers_;
  }

 private:
  std::atomic<std::int64_t> now_;
  std::mutex mu_;
  std::condition_variable_any cv_;
  std::size_t sleepers_ = 0;
};

}  // namespace sluice::testing
