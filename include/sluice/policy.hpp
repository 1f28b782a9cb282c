// SPDX-License-Identifier: Apache-2.0
// sluice/policy.hpp — what a limit is, independent of where it is enforced.
//
// A `policy` names an algorithm and its parameters; a `rule` gives a policy a name and, for dual-layer
// rules, a second policy for the tenant layer. The in-process backend, the Redis backend and the
// configuration loader all speak these types, so one rule means the same thing everywhere.
//
//   sluice::rule api{.name = "api", .limit = sluice::token_bucket_policy(sluice::per_second(5), 60)};
//   sluice::rule ai{.name = "ai", .limit = sluice::sliding_window_policy(100, std::chrono::seconds(60))};
//
// Thread-safe: plain values.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "sluice/clock.hpp"
#include "sluice/decision.hpp"
#include "sluice/error.hpp"

namespace sluice {

/// The longest key or id, in bytes, that any limiter accepts. Longer ones get `errc::key_too_long`.
inline constexpr std::size_t max_key_length = 512;

/// A refill rate in tokens per second. `rate::infinite()` admits everything.
struct rate {
  double per_second = 0;

  static constexpr rate infinite() noexcept { return {std::numeric_limits<double>::infinity()}; }
  bool is_infinite() const noexcept { return per_second == std::numeric_limits<double>::infinity(); }
  friend bool operator==(rate, rate) = default;
};

constexpr rate per_second(double n) noexcept { return {n}; }
constexpr rate per_minute(double n) noexcept { return {n / 60.0}; }
/// One token every `d`, as Go's rate.Every.
template <class Rep, class Period>
constexpr rate every(std::chrono::duration<Rep, Period> d) noexcept {
  return {1.0 / std::chrono::duration<double>(d).count()};
}

enum class algorithm : std::uint8_t {
  token_bucket,            ///< GCRA: rate + burst (x/time/rate semantics).
  sliding_window_log,      ///< Exact: at most `limit` in any window of length `window`.
  sliding_window_counter,  ///< O(1) approximation of the log (see sliding_window_counter.hpp).
  fixed_window,            ///< Quotas: at most `limit` per aligned window.
};

/// Config spelling: "token_bucket", "sliding_window" (the log), "sliding_window_counter", "fixed_window".
std::string_view to_string(algorithm a) noexcept;
std::optional<algorithm> algorithm_from_string(std::string_view s) noexcept;

/// One limiter's parameters. Token bucket uses `rate` and `burst`; the windows use `limit` and `window`.
/// A fixed window that follows the UTC calendar (quotas and billing): a day from midnight, an ISO
/// week from Monday, a month from its first day, whatever its length (28 to 31 days).
enum class calendar : std::uint8_t { none, day, week, month };

std::string_view to_string(calendar c) noexcept;  // "", "calendar_day", "calendar_week", "calendar_month"

/// The `window` of a calendar policy: a day, a week, and for a month the longest one (31 days), which
/// bounds how long its state lives; its reset is still the month's real end.
nanoseconds nominal_window(calendar c) noexcept;

struct policy {
  sluice::algorithm algorithm = algorithm::token_bucket;
  sluice::rate rate{};     ///< Token bucket: refill rate. >= 0. Default: 0.
  std::int64_t burst = 0;  ///< Token bucket: capacity. >= 0. Default: 0.
  std::int64_t limit = 0;  ///< Windows: admissions per window. > 0. Default: 0.
  nanoseconds window{0};   ///< Windows: length. > 0. Default: 0.
  /// Fixed window only: windows on the UTC calendar, `window` then nominal_window(calendar).
  sluice::calendar calendar = calendar::none;

  /// The capacity a decision reports as `limit`: burst, or limit.
  std::int64_t capacity() const noexcept { return algorithm == algorithm::token_bucket ? burst : limit; }
  friend bool operator==(const policy&, const policy&) = default;
};

inline policy token_bucket_policy(sluice::rate r, std::int64_t burst) {
  return {.algorithm = algorithm::token_bucket, .rate = r, .burst = burst};
}
inline policy sliding_window_policy(std::int64_t limit, nanoseconds window) {
  return {.algorithm = algorithm::sliding_window_log, .limit = limit, .window = window};
}
inline policy sliding_window_counter_policy(std::int64_t limit, nanoseconds window) {
  return {.algorithm = algorithm::sliding_window_counter, .limit = limit, .window = window};
}
inline policy fixed_window_policy(std::int64_t limit, nanoseconds window) {
  return {.algorithm = algorithm::fixed_window, .limit = limit, .window = window};
}
inline policy calendar_window_policy(std::int64_t limit, sluice::calendar c) {
  return {.algorithm = algorithm::fixed_window, .limit = limit, .window = nominal_window(c), .calendar = c};
}

/// Checks a policy's parameters; the error names the first bad one ("burst must be >= 0, got -1").
result<void> validate(const policy& p);

namespace detail {
// The errors of the checks below, out of line: the checks run on every request and inline.
result<void> cost_error(std::int64_t cost, std::int64_t capacity, std::string_view capacity_name);
result<void> key_error(std::string_view key, std::string_view what);
}  // namespace detail

/// The same check as validate_cost(policy, cost) with the capacity given directly; `capacity` <= 0
/// means no upper bound. `capacity_name` names it in the message ("burst", "limit").
inline result<void> validate_cost(std::int64_t cost, std::int64_t capacity, std::string_view capacity_name) {
  if (cost > 0 && (capacity <= 0 || cost <= capacity)) return {};
  return detail::cost_error(cost, capacity, capacity_name);
}

/// Checks a cost against a policy: cost > 0, and cost <= capacity when capacity > 0 (a zero-capacity
/// bucket refuses everything as a decision; an infinite rate admits any cost).
inline result<void> validate_cost(const policy& p, std::int64_t cost) {
  if (p.algorithm == algorithm::token_bucket) return validate_cost(cost, p.rate.is_infinite() ? 0 : p.burst, "burst");
  return validate_cost(cost, p.limit, "limit");
}

/// Whether `cost` is more than `p` can ever admit (validate_cost's errc::cost_exceeds_burst): a
/// refusal for ever rather than a bad request, for the callers that say so (backend::check_all).
bool exceeds_capacity(const policy& p, std::int64_t cost) noexcept;
/// Checks a key or id: at most `max_key_length` bytes. Any bytes are allowed.
inline result<void> validate_key(std::string_view key, std::string_view what = "key") {
  if (key.size() <= max_key_length) return {};
  return detail::key_error(key, what);
}

/// What an in-process keyed limiter does with a new key when it already holds its maximum number of
/// keys and none of the sampled entries is idle (an idle entry is always dropped first: that loses
/// nothing).
enum class when_full : std::uint8_t {
  evict,   ///< Drop the sampled entry using the least of its capacity; that key starts afresh. Default.
  refuse,  ///< Refuse the new key (errc::capacity_exhausted) until an entry is idle.
};

/// Serving a rule shared through Redis from leases (redis_backend.hpp, "Leases"): an instance takes
/// a key's units from the shared state ahead of its checks and admits from them in process. Off
/// unless a rule has one; the in-process backend, exact and local already, ignores it.
struct lease_policy {
  /// 10 ms to 10 s. Default: 200 ms. A key's leases are sized to about its demand over this
  /// period (two, once it is busy) and given back once the key goes unchecked for this long; a
  /// token bucket's lease holds slots up to this far ahead.
  nanoseconds period = std::chrono::milliseconds(200);
  /// The most of the leased layer's capacity one instance holds at once, 0 < max_share <= 0.5
  /// (at least one unit). Default: 0.1.
  double max_share = 0.1;
  friend bool operator==(const lease_policy&, const lease_policy&) = default;
};

/// A named limit. With `tenant` set it is a dual-layer rule: `limit` applies per (tenant, user),
/// `tenant` per tenant, and a check is admitted only when both admit.
struct rule {
  std::string name;
  policy limit;
  std::optional<policy> tenant;
  /// The in-process backend at its key cap (see when_full). Default: evict.
  sluice::when_full when_full = when_full::evict;
  /// Leases for the shared layer: the rule's limit, or a dual-layer rule's tenant layer (the user
  /// layer stays exact). Not for a sliding window log. Default: none (every check asks Redis).
  std::optional<lease_policy> lease;
  /// Refusals only counted, never enforced (a new rule rolled out): surfaces that serve the rule
  /// (sluiced) admit what it refuses, and say so. Backends decide as for any rule. Default: false.
  bool shadow = false;

  bool is_dual_layer() const noexcept { return tenant.has_value(); }
  /// The layer `lease` applies to: a dual-layer rule's tenant layer, else `limit`.
  const policy& leased_layer() const noexcept { return tenant ? *tenant : limit; }
  friend bool operator==(const rule&, const rule&) = default;
};

result<void> validate(const rule& r);

/// The decision for a check admitted without being counted (limiting disabled, a backend failing
/// open): every layer of `r` with its whole capacity left, combined as any dual-layer decision,
/// marked with `source`.
decision full_capacity_decision(const rule& r, decision_source source) noexcept;

}  // namespace sluice
