// SPDX-License-Identifier: Apache-2.0
// sluice/gcra.hpp — the token bucket as a pure function (GCRA, x/time/rate semantics).
//
// The whole bucket is one integer: the theoretical arrival time (TAT), the time at which the bucket
// will be full again. With interval I = 1/rate and tolerance τ = burst × I:
//   tokens(now) = (τ − max(0, TAT − now)) / I
//   admitting `cost` moves TAT to max(TAT, now) + cost × I, allowed iff that is <= now + τ.
// A new bucket (TAT in the past) is full; a refused check leaves TAT unchanged.
//
//   sluice::gcra_params p = sluice::make_gcra_params(sluice::per_second(5), 60);
//   sluice::gcra_state s;
//   sluice::decision d = s.evaluate(p, now_ns, 1);
//   if (d.allowed) s.commit(p, now_ns, 1);
//
// Not thread-safe: callers own the synchronisation (token_bucket does it with one CAS).
#pragma once

#include <algorithm>
#include <cstdint>

#include "sluice/decision.hpp"
#include "sluice/policy.hpp"
#include "sluice/saturating.hpp"

namespace sluice {

/// The largest tolerance (burst × interval) a bucket uses: 2^62 ns, about 146 years. Rates so low
/// that burst × interval would exceed it (rate 0 included) are raised to exactly this, so
/// arithmetic on `now + τ` stays far from overflow.
inline constexpr std::int64_t gcra_max_tolerance_ns = std::int64_t{1} << 62;

struct gcra_params {
  std::int64_t interval_ns = 0;   ///< ns per token; 0 means an infinite rate (admit everything).
  std::int64_t burst = 0;         ///< Capacity in tokens.
  std::int64_t tolerance_ns = 0;  ///< burst × interval.

  friend bool operator==(const gcra_params&, const gcra_params&) = default;
};

/// Converts rate and burst to integer parameters. The interval is rounded to the nearest ns and is
/// at least 1 ns, so rates above 10^9 per second act as 10^9 per second (but `rate::infinite()`
/// admits everything). Preconditions: rate >= 0, burst >= 0 (see validate(policy)).
gcra_params make_gcra_params(rate r, std::int64_t burst) noexcept;

/// One bucket's state: the theoretical arrival time in ns. Trivially copyable, 8 bytes.
struct gcra_state {
  /// "Long ago": a new bucket is full.
  static constexpr std::int64_t empty_tat = saturating::min;

  std::int64_t tat = empty_tat;

  /// The decision admitting `cost` at `now` would get; changes nothing. `remaining` and
  /// `reset_after` describe the state after admission when allowed, the current state when refused.
  /// Precondition: 0 < cost <= burst, or an infinite rate, or burst == 0 (refused, retry `never`).
  decision evaluate(const gcra_params& p, std::int64_t now, std::int64_t cost) const noexcept {
    decision d;
    d.limit = p.burst;
    if (p.interval_ns == 0) {  // infinite rate
      d.allowed = true;
      d.remaining = p.burst;
      return d;
    }
    if (p.burst == 0) {
      d.retry_after = never;
      return d;
    }
    std::int64_t base = std::max(tat, now);
    std::int64_t new_tat = admitted_tat(p, now, cost);
    std::int64_t allow_at = saturating::sub(new_tat, p.tolerance_ns);
    d.allowed = allow_at <= now;
    std::int64_t debt_ns = saturating::sub(d.allowed ? new_tat : base, now);  // >= 0
    d.remaining = std::max<std::int64_t>(0, saturating::sub(p.tolerance_ns, debt_ns) / p.interval_ns);
    d.reset_after = nanoseconds(debt_ns);
    if (!d.allowed) d.retry_after = nanoseconds(saturating::sub(allow_at, now));
    return d;
  }

  /// Records `cost` at `now` (after an allowed evaluate).
  void commit(const gcra_params& p, std::int64_t now, std::int64_t cost) noexcept {
    if (p.interval_ns != 0) tat = admitted_tat(p, now, cost);
  }

  /// Moves to new parameters at `now` keeping the tokens the bucket holds (x/time/rate's SetLimit
  /// and SetBurst): the tokens available, fractions included, carry over, capped by the new burst;
  /// a full bucket stays full, an infinite rate (either side) leaves it full.
  void retune(const gcra_params& from, const gcra_params& to, std::int64_t now) noexcept;

  /// The time at which the bucket is full again; an entry idle since then carries no information.
  std::int64_t idle_at(const gcra_params& /*p*/) const noexcept { return tat; }

  /// TAT after admitting `cost` at `now`.
  static std::int64_t next_tat(std::int64_t tat, const gcra_params& p, std::int64_t now, std::int64_t cost) noexcept {
    return saturating::add(std::max(tat, now), saturating::mul(cost, p.interval_ns));
  }

 private:
  std::int64_t admitted_tat(const gcra_params& p, std::int64_t now, std::int64_t cost) const noexcept {
    return next_tat(tat, p, now, cost);
  }
};

}  // namespace sluice
