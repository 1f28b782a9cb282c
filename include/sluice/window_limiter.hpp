// SPDX-License-Identifier: Apache-2.0
// sluice/window_limiter.hpp — thread-safe window limiters: sliding window log, sliding window
// counter and fixed window, each one limit of N per window W.
//
//   auto log = sluice::sliding_window_log::create({.limit = 100, .window = std::chrono::seconds(60)});
//   sluice::decision d = log->try_acquire(now, 1).value();
//   // sliding_window_counter and fixed_window take the same options.
//
// See window_states.hpp for each algorithm's exact semantics and the counter's worst-case error.
// Thread-safe: one small mutex per limiter (the log's state is O(N); the counters could be made
// lock-free, but a mutex around a few integer operations costs ~20 ns uncontended).
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

#include "sluice/clock.hpp"
#include "sluice/decision.hpp"
#include "sluice/error.hpp"
#include "sluice/limiter_state.hpp"
#include "sluice/policy.hpp"
#include "sluice/window_states.hpp"

namespace sluice {

template <class State, algorithm Algorithm>
class window_limiter {
 public:
  struct options {
    std::int64_t limit = 0;                ///< Admissions per window; > 0. Default: 0 (invalid).
    nanoseconds window{0};                 ///< Window length; > 0. Default: 0 (invalid).
    sluice::clock* clock = &real_clock();  ///< Read by the overload without `now`. Default: real_clock().
  };

  /// Returns an empty limiter, or an error naming the first invalid option.
  static result<window_limiter> create(const options& o) {
    if (auto v = validate(policy{.algorithm = Algorithm, .limit = o.limit, .window = o.window}); !v) return v.error();
    if (o.clock == nullptr) return {errc::invalid_argument, "clock must not be null"};
    return window_limiter(o);
  }

  /// Moving is not thread-safe: move only a limiter nobody else uses.
  window_limiter(window_limiter&& other) noexcept
      : params_(other.params_), state_(std::move(other.state_)), clock_(other.clock_) {}

  /// Admits `cost` at `now` if the window has room, recording it; otherwise refuses and records
  /// nothing. Errors: cost <= 0 (invalid_argument), cost > limit (cost_exceeds_burst).
  result<decision> try_acquire(time_point now, std::int64_t cost = 1) {
    if (auto c = validate_cost(cost, params_.limit, "limit"); !c) return c.error();
    std::lock_guard lock(mutex_);
    return check_and_commit(state_, params_, to_ns(now), cost);
  }
  result<decision> try_acquire(std::int64_t cost = 1) { return try_acquire(clock_->now(), cost); }

  std::int64_t limit() const noexcept { return params_.limit; }
  nanoseconds window() const noexcept { return nanoseconds(params_.window_ns); }

 private:
  explicit window_limiter(const options& o)
      : params_{.limit = o.limit, .window_ns = o.window.count()}, clock_(o.clock) {}

  const window_params params_;
  std::mutex mutex_;
  State state_;  // guarded by mutex_
  sluice::clock* clock_;
};

/// Exact: at most N in any window (now − W, now]. O(N) memory.
using sliding_window_log = window_limiter<sliding_window_log_state, algorithm::sliding_window_log>;
/// O(1) approximation of the log; see sliding_window_counter_state for its worst-case error.
using sliding_window_counter = window_limiter<sliding_window_counter_state, algorithm::sliding_window_counter>;
/// At most N per aligned window (quotas).
using fixed_window = window_limiter<fixed_window_state, algorithm::fixed_window>;

}  // namespace sluice
