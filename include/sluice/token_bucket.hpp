// sluice/token_bucket.hpp — a lock-free token bucket with the semantics of Go's x/time/rate.
//
// A bucket of `burst` tokens refilled at `rate` per second; it starts full; a check of `cost`
// takes that many tokens or, when there are not enough, refuses and takes nothing. The whole state
// is one atomic 64-bit word (GCRA's theoretical arrival time, see gcra.hpp), so an uncontended
// check costs one compare-and-swap.
//
//   auto bucket = sluice::token_bucket::create({.rate = sluice::per_second(5), .burst = 60});
//   if (!bucket) return fail(bucket.error().message);
//   sluice::decision d = bucket->try_acquire(now, 1).value();   // `now` passed in
//   auto r = bucket->reserve(now, 10);                           // returns the delay; cancel() gives back
//   auto w = bucket->wait(1, deadline, stop_token);               // blocks on the bucket's clock
//
// Thread-safe: every method may be called concurrently (set_rate/set_burst included).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <stop_token>

#include "sluice/clock.hpp"
#include "sluice/decision.hpp"
#include "sluice/error.hpp"
#include "sluice/gcra.hpp"
#include "sluice/policy.hpp"

namespace sluice {

/// Tokens reserved by token_bucket::reserve(). A plain value; cancel it through the same bucket.
struct reservation {
  std::int64_t tokens = 0;
  time_point time_to_act{};         ///< When the tokens are available (the reservation's moment).
  std::int64_t tat_after = 0;       ///< The bucket's TAT right after this reservation.

  /// How long from `now` until the reservation may act; zero when it already may.
  nanoseconds delay_from(time_point now) const noexcept {
    return time_to_act > now ? time_to_act - now : nanoseconds::zero();
  }
};

class token_bucket {
 public:
  struct options {
    sluice::rate rate{};                 ///< Refill rate; >= 0; rate::infinite() admits all. Default: 0.
    std::int64_t burst = 0;              ///< Capacity; >= 0; 0 refuses everything. Default: 0.
    sluice::clock* clock = &real_clock();  ///< Read by the overloads without `now` and by wait(). Default: real_clock().
  };

  /// Returns a full bucket, or an error naming the first invalid option.
  static result<token_bucket> create(const options& o);

  /// Moving is not thread-safe: move only a bucket nobody else uses.
  token_bucket(token_bucket&& other) noexcept;
  token_bucket& operator=(token_bucket&&) = delete;

  /// Takes `cost` tokens at `now` if the bucket holds them; otherwise refuses and takes nothing.
  /// Errors: cost <= 0 (invalid_argument); cost > burst with burst > 0 and a finite rate
  /// (cost_exceeds_burst: it could never succeed). With burst 0 every check is refused with
  /// retry_after = `never`. Time going backwards is treated as no time passing.
  result<decision> try_acquire(time_point now, std::int64_t cost = 1) noexcept;
  result<decision> try_acquire(std::int64_t cost = 1) noexcept { return try_acquire(clock_->now(), cost); }

  /// Reserves `cost` tokens at `now` whatever the bucket holds; the tokens are the caller's at
  /// `time_to_act`. The bucket goes into debt, so later checks wait behind the reservation.
  /// Errors as try_acquire; with burst 0 (finite rate) cost_exceeds_burst.
  result<reservation> reserve(time_point now, std::int64_t cost = 1) noexcept;

  /// Gives a reservation's tokens back, as x/time/rate's CancelAt: nothing once its time has come;
  /// otherwise its tokens less those reserved after it (they keep their place).
  void cancel(const reservation& r, time_point now) noexcept;

  /// Blocks on the bucket's clock until `cost` tokens are available and takes them. Fails at once,
  /// taking nothing, with deadline_exceeded when they cannot be available by `deadline`; fails with
  /// cancelled (tokens given back) when `stop` is requested while waiting.
  result<void> wait(std::int64_t cost, time_point deadline, std::stop_token stop = {});

  /// Changes the rate or the burst live. The tokens held at `now` are kept (capped to the burst at
  /// the next check), as x/time/rate's SetLimitAt/SetBurstAt. Errors: invalid values; nothing changes.
  result<void> set_rate(sluice::rate r, time_point now);
  result<void> set_burst(std::int64_t burst, time_point now);

  sluice::rate rate() const noexcept;
  std::int64_t burst() const noexcept { return burst_.load(std::memory_order_relaxed); }

  /// Whole tokens available at `now` (negative while reservations are outstanding).
  std::int64_t tokens(time_point now) const noexcept;

 private:
  explicit token_bucket(const options& o);

  gcra_params params() const noexcept {
    return {interval_.load(std::memory_order_relaxed), burst_.load(std::memory_order_relaxed),
            tolerance_.load(std::memory_order_relaxed)};
  }
  result<void> check_cost(const gcra_params& p, std::int64_t cost) const noexcept;
  result<void> change(std::optional<sluice::rate> r, std::optional<std::int64_t> burst, time_point now);

  // The bucket's state: one word, updated with compare-and-swap.
  std::atomic<std::int64_t> tat_{gcra_state::empty_tat};
  // Parameters: read relaxed on every check; written only under change_mutex_. A check racing a
  // change sees the old or the new values (briefly a mix): never an invalid state.
  std::atomic<std::int64_t> interval_;
  std::atomic<std::int64_t> burst_;
  std::atomic<std::int64_t> tolerance_;
  std::atomic<double> rate_;
  std::mutex change_mutex_;
  sluice::clock* clock_;
};

}  // namespace sluice
