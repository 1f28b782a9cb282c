// SPDX-License-Identifier: Apache-2.0
// src/redis/server_clock.hpp — the Redis server's clock seen from this process: a lower bound of
// its offset from our steady clock, and a check's deadline moved into the server's time.
//
// A server time read by a script (or TIME) that has just replied was read no later than now, so
// server − now bounds the offset from below. The bound kept is the largest of the last one to two
// seconds: the tightest, yet following a server clock that is stepped back. A script that starts
// after the deadline it is sent records nothing (scripts.cpp), so a check that timed out here is
// never applied later; the bound errs early (a call within one round trip of its deadline may be
// refused as late), never late.
//
//   detail::server_clock clock;
//   clock.observe(reply_server_us, detail::server_clock::local_now_us());   // each reply
//   std::int64_t deadline = clock.server_us_at(detail::server_clock::local_us(check_deadline));
//
// Thread-safe: observe() from one thread at a time (the backend's strand), the rest from any.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>

namespace sluice::detail {

class server_clock {
 public:
  /// offset_us() before the first observe().
  static constexpr std::int64_t unknown = std::numeric_limits<std::int64_t>::min();

  /// A time of our steady clock in µs (what observe and server_us_at take as `local_us`).
  static std::int64_t local_us(std::chrono::steady_clock::time_point t) noexcept {
    return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
  }
  static std::int64_t local_now_us() noexcept { return local_us(std::chrono::steady_clock::now()); }

  /// A server time (µs) that was read no later than `local_us`.
  void observe(std::int64_t server_us, std::int64_t local_us) noexcept {
    const std::int64_t sample = server_us - local_us;
    if (local_us - epoch_start_us_ > 1'000'000) {
      previous_max_ = current_max_;
      current_max_ = sample;
      epoch_start_us_ = local_us;
    } else {
      current_max_ = std::max(current_max_, sample);
    }
    offset_us_.store(std::max(previous_max_, current_max_), std::memory_order_relaxed);
  }

  /// Server µs − local steady µs, a lower bound; `unknown` until a server time is observed.
  std::int64_t offset_us() const noexcept { return offset_us_.load(std::memory_order_relaxed); }

  /// The server time (µs, a lower bound) at local steady time `local_us`, or -1 while unknown: a
  /// check's deadline moved into the server's time (a call applied later records nothing).
  std::int64_t server_us_at(std::int64_t local_us) const noexcept {
    const std::int64_t offset = offset_us();
    return offset == unknown ? -1 : local_us + offset;
  }

 private:
  std::int64_t epoch_start_us_ = 0;  // observe() only
  std::int64_t current_max_ = unknown;
  std::int64_t previous_max_ = unknown;
  std::atomic<std::int64_t> offset_us_{unknown};
};

}  // namespace sluice::detail
