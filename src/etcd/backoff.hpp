// SPDX-License-Identifier: Apache-2.0
// src/etcd/backoff.hpp (private) — how long the watcher waits before reconnecting: capped
// exponential backoff with jitter, so that many instances that lost one etcd do not all come back
// in the same instant.
//
//   backoff b(200ms, 10s);            // base, cap
//   auto wait = b.delay(failures);   // in [c/2, c], c = min(cap, base * 2^failures)
//
//   reread_pacing p(b, 10s);          // full reads closer than 10 s to the one before back off
//   auto wait = p.wait_before(now);   // 0 for the first, or after a watch that lasted 10 s
//   p.read_ended(later);
//
// Not thread-safe (they hold a random generator).
#pragma once

#include <algorithm>
#include <chrono>
#include <random>

namespace sluice::etcd::detail {

class backoff {
 public:
  backoff(std::chrono::milliseconds base, std::chrono::milliseconds cap)
      : base_(base), cap_(std::max(base, cap)), rng_(std::random_device{}()) {}

  /// The wait after `failures` failed attempts in a row (0 after a connection that worked).
  std::chrono::milliseconds delay(unsigned failures) {
    auto ceiling = base_;
    for (unsigned i = 0; i < failures && ceiling < cap_; ++i) ceiling *= 2;
    ceiling = std::min(ceiling, cap_);
    std::uniform_int_distribution<long long> pick(ceiling.count() / 2, ceiling.count());
    return std::chrono::milliseconds(pick(rng_));
  }

 private:
  std::chrono::milliseconds base_;
  std::chrono::milliseconds cap_;
  std::mt19937_64 rng_;
};

/// Full reads of the prefix that follow each other closely — an etcd or proxy that cancels or
/// compacts every watch as soon as it is made — are spaced by the backoff, growing with each one
/// in a row, as clientv3 spaces its watch retries; a read after a watch that lasted `close` or
/// longer goes at once.
class reread_pacing {
 public:
  using clock = std::chrono::steady_clock;

  reread_pacing(backoff& delays, std::chrono::milliseconds close) : delays_(delays), close_(close) {}

  /// The wait before a full read wanted at `now`: what is left of the backoff since the last read
  /// ended (a reconnection's own wait counts).
  std::chrono::milliseconds wait_before(clock::time_point now) {
    using std::chrono::milliseconds;
    const auto since = std::chrono::duration_cast<milliseconds>(now - last_end_);
    if (!read_before_ || since >= close_) {
      in_a_row_ = 0;
      return milliseconds::zero();
    }
    return std::max(milliseconds::zero(), delays_.delay(++in_a_row_) - since);
  }
  /// A full read, done or failed, ended at `now`.
  void read_ended(clock::time_point now) {
    read_before_ = true;
    last_end_ = now;
  }

 private:
  backoff& delays_;
  std::chrono::milliseconds close_;
  bool read_before_ = false;
  clock::time_point last_end_{};
  unsigned in_a_row_ = 0;  // reads, each close to the one before
};

}  // namespace sluice::etcd::detail
