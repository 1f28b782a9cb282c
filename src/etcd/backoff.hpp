// src/etcd/backoff.hpp (private) — how long the watcher waits before reconnecting: capped
// exponential backoff with jitter, so that many instances that lost one etcd do not all come back
// in the same instant.
//
//   backoff b(200ms, 10s);            // base, cap
//   auto wait = b.delay(failures);   // in [c/2, c], c = min(cap, base * 2^failures)
//
// Not thread-safe (it holds its random generator).
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

}  // namespace sluice::etcd::detail
