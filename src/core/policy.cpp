// SPDX-License-Identifier: Apache-2.0
#include "sluice/policy.hpp"

#include <cmath>
#include <string>

namespace sluice {

std::string_view to_string(algorithm a) noexcept {
  switch (a) {
    case algorithm::token_bucket: return "token_bucket";
    case algorithm::sliding_window_log: return "sliding_window";
    case algorithm::sliding_window_counter: return "sliding_window_counter";
    case algorithm::fixed_window: return "fixed_window";
  }
  return "unknown";
}

std::optional<algorithm> algorithm_from_string(std::string_view s) noexcept {
  for (auto a : {algorithm::token_bucket, algorithm::sliding_window_log, algorithm::sliding_window_counter,
                 algorithm::fixed_window}) {
    if (s == to_string(a)) return a;
  }
  if (s == "sliding_window_log") return algorithm::sliding_window_log;
  return std::nullopt;
}

std::string_view to_string(calendar c) noexcept {
  switch (c) {
    case calendar::none: return "";
    case calendar::day: return "calendar_day";
    case calendar::week: return "calendar_week";
    case calendar::month: return "calendar_month";
  }
  return "";
}

nanoseconds nominal_window(calendar c) noexcept {
  using days = std::chrono::days;
  switch (c) {
    case calendar::none: return nanoseconds(0);
    case calendar::day: return days(1);
    case calendar::week: return days(7);
    case calendar::month: return days(31);
  }
  return nanoseconds(0);
}

result<void> validate(const policy& p) {
  if (p.algorithm == algorithm::token_bucket) {
    if (std::isnan(p.rate.per_second) || p.rate.per_second < 0) {
      return {errc::invalid_argument, "rate must be >= 0 tokens per second, got " + std::to_string(p.rate.per_second)};
    }
    if (p.burst < 0) return {errc::invalid_argument, "burst must be >= 0, got " + std::to_string(p.burst)};
    return {};
  }
  if (p.limit <= 0) return {errc::invalid_argument, "limit must be > 0, got " + std::to_string(p.limit)};
  if (p.calendar != calendar::none) {
    if (p.algorithm != algorithm::fixed_window) {
      return {errc::invalid_argument, std::string(to_string(p.calendar)) + " windows are for fixed_window only"};
    }
    if (p.window != nominal_window(p.calendar)) {
      return {errc::invalid_argument, "a " + std::string(to_string(p.calendar)) + " window is " +
                                          std::to_string(std::chrono::duration_cast<std::chrono::hours>(
                                                             nominal_window(p.calendar)).count() / 24) +
                                          " days long (calendar_window_policy)"};
    }
  }
  if (p.window <= nanoseconds::zero()) {
    return {errc::invalid_argument, "window must be > 0, got " + std::to_string(p.window.count()) + " ns"};
  }
  return {};
}

result<void> detail::cost_error(std::int64_t cost, std::int64_t capacity, std::string_view capacity_name) {
  if (cost <= 0) return {errc::invalid_argument, "cost must be > 0, got " + std::to_string(cost)};
  return {errc::cost_exceeds_burst, "cost " + std::to_string(cost) + " exceeds " + std::string(capacity_name) + " " +
                                        std::to_string(capacity) + ": it can never be admitted"};
}

bool exceeds_capacity(const policy& p, std::int64_t cost) noexcept {
  auto v = validate_cost(p, cost);
  return !v && v.error().code == errc::cost_exceeds_burst;
}

result<void> detail::key_error(std::string_view key, std::string_view what) {
  return {errc::key_too_long, std::string(what) + " is " + std::to_string(key.size()) + " bytes; the maximum is " +
                                  std::to_string(max_key_length)};
}

result<void> validate(const rule& r) {
  if (r.name.empty()) return {errc::invalid_argument, "rule name must not be empty"};
  if (auto v = validate(r.limit); !v) return {v.error().code, "rule '" + r.name + "': " + v.error().message};
  if (r.tenant) {
    if (auto v = validate(*r.tenant); !v)
      return {v.error().code, "rule '" + r.name + "' tenant layer: " + v.error().message};
  }
  if (r.lease) {
    const lease_policy& l = *r.lease;
    if (l.period < std::chrono::milliseconds(10) || l.period > std::chrono::seconds(10)) {
      return {errc::invalid_argument, "rule '" + r.name + "': lease period must be 10 ms to 10 s"};
    }
    if (!(l.max_share > 0 && l.max_share <= 0.5)) {
      return {errc::invalid_argument, "rule '" + r.name + "': lease max_share must be > 0 and <= 0.5"};
    }
    if (r.leased_layer().calendar != calendar::none) {
      // A lease's units are valid until its window ends, found from a fixed length.
      return {errc::invalid_argument, "rule '" + r.name + "': a calendar window cannot be leased"};
    }
    if (r.leased_layer().algorithm == algorithm::sliding_window_log) {
      // A log keeps each admission's own time: units taken ahead would be logged when leased,
      // not when used, and so leave the window too early.
      return {errc::invalid_argument, "rule '" + r.name +
                                          "': a sliding_window (log) cannot be leased; use "
                                          "sliding_window_counter or fixed_window"};
    }
  }
  return {};
}

decision full_capacity_decision(const rule& r, decision_source source) noexcept {
  const decision user{.allowed = true, .limit = r.limit.capacity(), .remaining = r.limit.capacity()};
  decision d = user;
  if (r.tenant) {
    d = combine_layers({.allowed = true, .limit = r.tenant->capacity(), .remaining = r.tenant->capacity()}, user);
  }
  d.source = source;
  return d;
}

}  // namespace sluice
