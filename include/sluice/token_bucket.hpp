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
  /// taking nothing, with deadline_exceeded when they cannot be available by `deadline` (and with
  /// the errors of reserve()); fails with cancelled, tokens given back, when `stop` is requested
  /// while waiting.
  result<void> wait(std::int64_t cost, time_point deadline, std::stop_token stop = {});

  /// Changes the rate or the burst live. The tokens held at `now` are kept (capped to the burst at
  /// the next check), as x/time/rate's SetLimitAt/SetBurstAt. Errors: invalid values; nothing changes.
  result<void> set_rate(sluice::rate r, time_point now);
  result<void> set_burst(std::int64_t burst, time_point now);

  sluice::rate rate() const noexcept;
  std::int64_t burst() const noexcept;

  /// Whole tokens available at `now` (negative while reservations are outstanding).
  std::int64_t tokens(time_point now) const noexcept;

 private:
  // The parameters a generation of the state word refers to. Written only while not current.
  struct params_slot {
    std::atomic<std::int64_t> interval_ns{0};
    std::atomic<std::int64_t> burst{0};
    std::atomic<std::int64_t> tolerance_ns{0};
    std::atomic<double> rate{0};
  };
  static constexpr std::int64_t generation_mask = 3;  // four parameter slots

  explicit token_bucket(const options& o);

  static std::int64_t tat_of(std::int64_t word) noexcept { return word & ~generation_mask; }
  static std::size_t generation_of(std::int64_t word) noexcept { return static_cast<std::size_t>(word & generation_mask); }
  /// TAT rounded up to a multiple of 4 ns (never admits early), tagged with its parameters' slot.
  static std::int64_t pack(std::int64_t tat, std::size_t generation) noexcept {
    return (saturating::add(tat, generation_mask) & ~generation_mask) | static_cast<std::int64_t>(generation);
  }
  gcra_params params_of(std::int64_t word) const noexcept;
  /// Reserves `cost` tokens unless they would be available only after `latest`.
  result<reservation> reserve_until(time_point now, std::int64_t cost, time_point latest) noexcept;
  result<void> change(std::optional<sluice::rate> r, std::optional<std::int64_t> burst, time_point now);

  // The whole state in one word, updated with compare-and-swap: the theoretical arrival time and,
  // in its two low bits, which slot holds the parameters it was computed with. A change of rate or
  // burst writes the next slot and then swaps in a word re-expressed in the new parameters, so a
  // check always pairs a TAT with the parameters it belongs to.
  std::atomic<std::int64_t> word_;
  params_slot slots_[generation_mask + 1];
  std::mutex change_mutex_;  // serialises changes
  sluice::clock* clock_;
};

}  // namespace sluice
