// SPDX-License-Identifier: Apache-2.0
// sluice/saturating.hpp — 64-bit integer arithmetic that clamps instead of overflowing.
//
// Limiter state is integer nanoseconds; times near the ends of the range (a clock far from its
// epoch, a rate of 0, a huge cost) must give clamped answers, never undefined behaviour.
//
// Thread-safe: pure functions.
#pragma once

#include <cstdint>
#include <limits>

namespace sluice::saturating {

inline constexpr std::int64_t max = std::numeric_limits<std::int64_t>::max();
inline constexpr std::int64_t min = std::numeric_limits<std::int64_t>::min();

constexpr std::int64_t add(std::int64_t a, std::int64_t b) noexcept {
  std::int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return b > 0 ? max : min;
  return r;
}

constexpr std::int64_t sub(std::int64_t a, std::int64_t b) noexcept {
  std::int64_t r;
  if (__builtin_sub_overflow(a, b, &r)) return b < 0 ? max : min;
  return r;
}

constexpr std::int64_t mul(std::int64_t a, std::int64_t b) noexcept {
  std::int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return (a < 0) != (b < 0) ? min : max;
  return r;
}

/// Floor division (rounds towards negative infinity); `b` must be > 0.
constexpr std::int64_t floor_div(std::int64_t a, std::int64_t b) noexcept {
  std::int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}

}  // namespace sluice::saturating
