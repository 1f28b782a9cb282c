// SPDX-License-Identifier: Apache-2.0
// sluice/window_states.hpp — the window algorithms as pure state machines.
//
// Each state has the same three members as gcra_state, so the single limiters, the keyed tables and
// the dual-layer check drive every algorithm the same way:
//   decision evaluate(params, now, cost)  — the decision admitting `cost` would get; records nothing
//   void commit(params, now, cost)        — records `cost` at `now` (after an allowed evaluate)
//   std::int64_t idle_at(params)          — from this time on the state is empty: dropping it changes nothing
// Times are integer ns. Time going backwards is treated as no time passing (windows never un-expire).
// Preconditions: 0 < cost <= limit (see validate_cost).
//
//   sluice::window_params p{.limit = 100, .window_ns = 60'000'000'000};
//   sluice::sliding_window_log_state log;
//   if (auto d = log.evaluate(p, now, 1); d.allowed) log.commit(p, now, 1);
//
// Not thread-safe: callers own the synchronisation.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "sluice/decision.hpp"
#include "sluice/policy.hpp"
#include "sluice/saturating.hpp"

namespace sluice {

struct window_params {
  std::int64_t limit = 0;      ///< Admissions per window, > 0.
  std::int64_t window_ns = 0;  ///< Window length, > 0.
  sluice::calendar calendar = calendar::none;  ///< Fixed windows only: on the UTC calendar.
};

/// The fixed window holding `t` (ns since the Unix epoch): [start, end). Aligned to multiples of
/// the window since the epoch; on the calendar, a UTC day, an ISO week (from Monday 00:00) or a
/// month from its first day (leap years included).
struct window_period {
  std::int64_t start = 0;
  std::int64_t end = 0;
};
window_period fixed_period(const window_params& p, std::int64_t t) noexcept;

/// Exact: at most `limit` admitted units in any window (now − W, now]. Keeps one entry (16 bytes)
/// per admission, whatever its cost, so memory is O(admissions in a window) — at most `limit`
/// entries — and every operation is O(log entries): a client choosing a large cost costs no more
/// than one choosing 1. Admissions at the same instant share an entry. Refused checks are not
/// recorded.
class sliding_window_log_state {
 public:
  decision evaluate(const window_params& p, std::int64_t now, std::int64_t cost);
  void commit(const window_params& p, std::int64_t now, std::int64_t cost);
  std::int64_t idle_at(const window_params& p) const noexcept;
  /// Entries currently held (including any not yet expired by a later evaluate).
  std::size_t size() const noexcept { return entries_.size() - head_; }
  /// Bytes of entries held, at the vector's capacity.
  std::size_t memory_bytes() const noexcept { return entries_.capacity() * sizeof(entry); }

 private:
  struct entry {
    std::int64_t time;   // ns
    std::int64_t total;  // units admitted from the first live entry's start up to this one, inclusive
  };

  std::int64_t effective_now(std::int64_t now) const noexcept {
    return size() > 0 ? std::max(now, entries_.back().time) : now;
  }
  std::int64_t live_units() const noexcept { return size() > 0 ? entries_.back().total - base_ : 0; }
  void expire(const window_params& p, std::int64_t now);

  std::vector<entry> entries_;  // ascending in time and total; live entries are [head_, size)
  std::size_t head_ = 0;
  std::int64_t base_ = 0;  // `total` of the last expired entry: live units = back().total − base_
};

/// O(1) approximation of the log over windows aligned to multiples of W: the estimate at `now` is
///   previous × (W − elapsed) / W + current,
/// where elapsed is the time since the current window began. Under evenly spread traffic it matches
/// the log. Worst case: it assumes the previous window's admissions were spread evenly, so a burst at
/// the end of the previous window lets up to limit × elapsed / W more through, i.e. fewer than
/// 2 × limit in some window of length W; and a burst at its start makes it refuse early, down to
/// limit × elapsed / W admissions where the log would admit `limit`.
struct sliding_window_counter_state {
  std::int64_t last_now = saturating::min;  ///< Time of the last admission.
  std::int64_t current = 0;                 ///< Admissions in last_now's window.
  std::int64_t previous = 0;                ///< Admissions in the window before it.

  decision evaluate(const window_params& p, std::int64_t now, std::int64_t cost) const noexcept;
  void commit(const window_params& p, std::int64_t now, std::int64_t cost) noexcept;
  std::int64_t idle_at(const window_params& p) const noexcept;
};

/// Fixed windows aligned to multiples of W since the clock's epoch: at most `limit` per window; the
/// count restarts at each boundary (quotas such as 200 per day).
struct fixed_window_state {
  std::int64_t last_now = saturating::min;  ///< Time of the last admission.
  std::int64_t count = 0;                   ///< Admissions in last_now's window.

  decision evaluate(const window_params& p, std::int64_t now, std::int64_t cost) const noexcept;
  void commit(const window_params& p, std::int64_t now, std::int64_t cost) noexcept;
  std::int64_t idle_at(const window_params& p) const noexcept;
};

}  // namespace sluice
