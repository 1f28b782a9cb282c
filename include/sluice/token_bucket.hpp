// SPDX-License-Identifier: Apache-2.0
// sluice/token_bucket.hpp — a lock-free token bucket with the semantics of Go's x/time/rate.
//
// A bucket of `burst` tokens refilled at `rate` per second; it starts full; a check of `cost`
// takes that many tokens or, when there are not enough, refuses and takes nothing. The whole state
// is one atomic 64-bit word (GCRA's theoretical arrival time, see gcra.hpp), so an uncontended
// check costs one compare-and-swap; the parameters it goes with and the time of the latest write
// sit beside it.
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
#include "sluice/saturating.hpp"

namespace sluice {

/// Tokens reserved by token_bucket::reserve(). A plain value; cancel it through the same bucket, once.
struct reservation {
  std::int64_t tokens = 0;
  time_point time_to_act{};      ///< When the tokens are available (the reservation's moment).
  std::int64_t interval_ns = 0;  ///< The bucket's interval when reserved; 0: an infinite rate, nothing taken.
  std::uint64_t epoch = 0;       ///< Which parameter set it was reserved under (changes count up).

  /// How long from `now` until the reservation may act; zero when it already may.
  nanoseconds delay_from(time_point now) const noexcept {
    return time_to_act > now ? time_to_act - now : nanoseconds::zero();
  }
};

class token_bucket {
 public:
  struct options {
    sluice::rate rate{};     ///< Refill rate; >= 0; rate::infinite() admits all. Default: 0.
    std::int64_t burst = 0;  ///< Capacity; >= 0; 0 refuses everything. Default: 0.
    sluice::clock* clock =
        &real_clock();  ///< Read by the overloads without `now` and by wait(). Default: real_clock().
  };

  /// Returns a full bucket, or an error naming the first invalid option.
  static result<token_bucket> create(const options& o);

  /// Moving is not thread-safe: move only a bucket nobody else uses.
  token_bucket(token_bucket&& other) noexcept;
  token_bucket& operator=(token_bucket&&) = delete;

  /// Takes `cost` tokens at `now` if the bucket holds them; otherwise refuses and takes nothing.
  /// Errors: cost <= 0 (invalid_argument); cost > burst with burst > 0 and a finite rate
  /// (cost_exceeds_burst: it could never succeed). With burst 0 every check is refused with
  /// retry_after = `never`.
  /// Time going backwards counts as no time passing: every method evaluates at the later of `now`
  /// and the latest `now` that changed the bucket, and retry_after / reset_after count from there.
  result<decision> try_acquire(time_point now, std::int64_t cost = 1) noexcept;
  result<decision> try_acquire(std::int64_t cost = 1) noexcept { return try_acquire(clock_->now(), cost); }

  /// Reserves `cost` tokens at `now` whatever the bucket holds; the tokens are the caller's at
  /// `time_to_act`. The bucket goes into debt, so later checks wait behind the reservation.
  /// Errors as try_acquire; with burst 0 (finite rate) cost_exceeds_burst.
  result<reservation> reserve(time_point now, std::int64_t cost = 1) noexcept;

  /// Gives a reservation's tokens back, as x/time/rate's CancelAt: nothing once its time has passed
  /// (cancelling at its very moment still gives back); otherwise its tokens less those reserved
  /// after it (they keep their place), counted at the rate it was reserved at, the bucket capped at
  /// its burst. Never more than it reserved; nothing for a reservation made at an infinite rate
  /// (it took nothing) or while the rate is infinite. Cancelling one reservation twice gives back twice.
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
  // One parameter set and the state word computed with it: the theoretical arrival time in ns,
  // every ns kept. A change of rate or burst fills the next block (its parameters, and the word
  // re-expressed in them) and then swaps the current block's word for a seal naming the next block.
  // That one compare-and-swap is the change's linearization point: a check that read the old word
  // fails its own CAS and follows the seal, so a TAT is never paired with the wrong parameters.
  // Blocks are reused round-robin; one is written only while no seal or current_ leads to it.
  struct alignas(64) block {  // what a check reads shares one cache line
    std::atomic<std::int64_t> word{gcra_state::empty_tat};
    std::atomic<std::int64_t> interval_ns{0};
    std::atomic<std::int64_t> burst{0};
    std::atomic<std::int64_t> tolerance_ns{0};
    // The latest evaluation time of a write (a change copies it on). Stored before the write's CAS
    // and read after loading the word, so whoever sees a word also sees (at least) the time it was
    // written at; two racing writers may leave the smaller, and then an operation is evaluated too
    // early, which with TAT >= that time (see record_write) only makes it stricter.
    std::atomic<std::int64_t> last{saturating::min};
    // x/time/rate's lastEvent, the moment of the latest reservation, is word - tolerance once this
    // block has admitted or reserved (`written`); until then the one carried over from before the
    // change, `last_event` (read and written under change_mutex_ only).
    std::atomic<bool> written{false};
    std::atomic<std::uint64_t> epoch{0};  // changes so far
    std::atomic<double> rate{0};
    // Left by the change that made this block current:
    std::atomic<std::int64_t> changed_at{saturating::min};  // when
    std::atomic<double> held{0};                            // the tokens held then
    std::atomic<std::int64_t> last_event{saturating::min};
    gcra_params params() const noexcept;
    void set(const gcra_params& p, sluice::rate r) noexcept;
  };
  static constexpr std::uint32_t block_count = 4;
  // Word values below `earliest` are never TATs: min is a new bucket's, min + 1 + i a seal to block i.
  static constexpr std::int64_t sealed_base = saturating::min + 1;
  static constexpr std::int64_t earliest = saturating::min + 8;  // `now` is clamped to at least this
  static bool is_sealed(std::int64_t word) noexcept { return word >= sealed_base && word < earliest; }

  struct view {
    block* b;
    std::int64_t word;
  };

  explicit token_bucket(const options& o);

  /// The current block and its word, following seals.
  view load() const noexcept;
  /// The time an operation at `now` is evaluated at: no earlier than the latest write.
  static std::int64_t evaluation_time(const block& b, time_point now) noexcept;
  static void record_write(block& b, std::int64_t t) noexcept;
  /// cancel() of a reservation made before the latest change of rate or burst.
  void cancel_across_change(const reservation& r, time_point now) noexcept;
  /// Reserves `cost` tokens unless they would be available only after `latest`.
  result<reservation> reserve_until(time_point now, std::int64_t cost, time_point latest) noexcept;
  result<void> change(std::optional<sluice::rate> r, std::optional<std::int64_t> burst, time_point now);

  std::atomic<std::uint32_t> current_{0};  // the block to start from (a seal may lead further)
  mutable block blocks_[block_count];
  std::mutex change_mutex_;  // serialises changes
  sluice::clock* clock_;
};

}  // namespace sluice
