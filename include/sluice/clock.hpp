// SPDX-License-Identifier: Apache-2.0
// sluice/clock.hpp — where limiters get `now` from.
//
// Every algorithm takes `now` as a parameter; a clock is only what convenience overloads and waits
// read. Pass a clock by reference; it must outlive its users.
//
//   sluice::clock& c = sluice::real_clock();          // CLOCK_MONOTONIC, ~20 ns a read
//   sluice::clock& fast = sluice::coarse_clock();     // CLOCK_MONOTONIC_COARSE, ~5 ns, 1-4 ms resolution
//   sluice::testing::simulated_clock sim;             // tests: advance() by hand, never sleep
//
// Thread-safe: every clock here may be read from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <stop_token>

namespace sluice {

/// Monotonic time with nanosecond resolution; the only time type limiters take.
using time_point = std::chrono::steady_clock::time_point;
using nanoseconds = std::chrono::nanoseconds;

/// Nanoseconds since the clock's epoch.
constexpr std::int64_t to_ns(time_point t) noexcept { return t.time_since_epoch().count(); }
constexpr time_point from_ns(std::int64_t ns) noexcept { return time_point(nanoseconds(ns)); }

/// A source of monotonic time. Thread-safe.
class clock {
 public:
  virtual ~clock() = default;

  /// Returns the current time. Never goes backwards for one clock.
  virtual time_point now() noexcept = 0;

  /// Blocks until `now() >= deadline` or `stop` is requested. Returns false when stopped first.
  virtual bool sleep_until(time_point deadline, std::stop_token stop) = 0;
};

/// CLOCK_MONOTONIC (std::chrono::steady_clock). Never destroyed.
clock& real_clock() noexcept;

/// CLOCK_MONOTONIC_COARSE: the time of the last scheduler tick. Cheaper to read than
/// `real_clock()`; its resolution is `coarse_clock_resolution()` (1 to 4 ms on Linux), so a limiter
/// reading it admits in steps of that length. Never destroyed.
clock& coarse_clock() noexcept;

/// CLOCK_MONOTONIC counted from the Unix epoch (its offset to CLOCK_REALTIME read once, at first
/// use): never steps with the wall clock, yet a fixed window of a minute starts at a wall-clock
/// minute, as on Redis (whose scripts read TIME) and in envoyproxy/ratelimit. sluiced's memory
/// backend reads it. Never destroyed.
clock& unix_epoch_clock() noexcept;
/// The resolution of `coarse_clock()`, as reported by clock_getres.
nanoseconds coarse_clock_resolution() noexcept;

}  // namespace sluice
