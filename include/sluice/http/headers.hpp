// sluice/http/headers.hpp — the one function that turns a decision into HTTP header fields.
//
// sluiced and both middlewares call `rate_limit_headers`, so every surface sends the same values:
//   X-RateLimit-Limit      the limit (burst or N)
//   X-RateLimit-Remaining  whole units left
//   X-RateLimit-Reset      Unix time, whole seconds (rounded up), at which the limiter is full again
//   Retry-After            on refusal only: whole seconds, rounded up, at least 1
//   RateLimit-Policy, RateLimit   (optional) draft-ietf-httpapi-ratelimit-headers structured fields:
//                          RateLimit-Policy: "api";q=60;w=12     RateLimit: "api";r=59;t=1
//
//   for (const auto& f : sluice::http::rate_limit_headers(d, rule, std::chrono::system_clock::now(), {}))
//     response.set(f.name, f.value);
//
// Thread-safe: pure functions.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/decision.hpp"
#include "sluice/policy.hpp"

namespace sluice::http {

struct header_options {
  /// Send the X-RateLimit-* fields. Default: true.
  bool legacy_fields = true;
  /// Send the IETF draft's RateLimit-Policy and RateLimit fields. Default: false.
  bool ietf_fields = false;
};

struct header_field {
  std::string_view name;
  std::string value;
};

/// Whole seconds, rounded up; 0 stays 0. Negative durations give 0.
std::int64_t ceil_seconds(nanoseconds d) noexcept;

/// The Retry-After value for a refusal: ceil_seconds(retry_after), at least 1. A `never` retry
/// gives one day (clients must not read it as "retry now").
std::int64_t retry_after_seconds(const decision& d) noexcept;

/// The header fields for a decision of `r` made at wall-clock time `wall_now`.
std::vector<header_field> rate_limit_headers(const decision& d, const rule& r,
                                             std::chrono::system_clock::time_point wall_now,
                                             const header_options& options);

/// The window, in whole seconds, the IETF `w` parameter reports: the window of a window policy,
/// or burst / rate (the time to refill an empty bucket) for a token bucket.
std::int64_t policy_window_seconds(const policy& p) noexcept;

}  // namespace sluice::http
