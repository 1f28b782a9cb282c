// SPDX-License-Identifier: Apache-2.0
// src/redis/exactness.hpp — what the Redis scripts can compute exactly, and the check that refuses
// the rest before anything is sent.
//
// The scripts compute in Lua numbers (doubles): integers are exact up to 2^53, and times in µs
// since the epoch plus a window must stay there. The limits this sets are documented, for users, in
// sluice/redis_backend.hpp (whose validate_for_redis(rule) is defined in exactness.cpp).
//
//   if (auto v = sluice::detail::validate_for_redis(rule.limit); !v) return v.error();
//
// Thread-safe: constants and a pure function.
#pragma once

#include <cstdint>

#include "sluice/error.hpp"
#include "sluice/policy.hpp"

namespace sluice::detail {

/// Largest burst or window limit the scripts count exactly.
inline constexpr std::int64_t max_exact_count = std::int64_t{1} << 53;
/// Longest window sent (µs, ~142 years); longer windows act as it.
inline constexpr std::int64_t max_window_us = std::int64_t{1} << 52;
/// Fastest finite token-bucket rate (per second): an interval of 1 µs.
inline constexpr double max_token_bucket_rate = 1e6;

/// Whether the scripts compute `p` exactly; else errc::invalid_argument naming the parameter.
result<void> validate_for_redis(const policy& p);

}  // namespace sluice::detail
