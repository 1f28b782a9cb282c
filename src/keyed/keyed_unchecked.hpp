// SPDX-License-Identifier: Apache-2.0
// The memory backend's way into keyed_limiter for checks that backend::check has validated: the
// limiter's own checks without their second validation.
#pragma once

#include <span>
#include <string_view>

#include "sluice/keyed.hpp"

namespace sluice::detail {

struct keyed_unchecked {
  using key_limits = keyed_limiter::key_limits;

  static result<decision> acquire(keyed_limiter& l, std::string_view key, time_point now, std::int64_t cost,
                                  const key_limits* limits) {
    return l.acquire(key, now, cost, limits);
  }
  static result<decision> acquire_dual(keyed_limiter& tenants, std::string_view tenant, keyed_limiter& users,
                                       std::string_view user, time_point now, std::int64_t cost,
                                       const key_limits* tenant_limits, const key_limits* user_limits) {
    return keyed_limiter::acquire_dual(tenants, tenant, users, user, now, cost, tenant_limits, user_limits);
  }
  static result<void> acquire_all(std::span<const keyed_limiter::keyed_check> checks, time_point now,
                                  std::span<decision> out) {
    return keyed_limiter::acquire_all(checks, now, out);
  }
};

}  // namespace sluice::detail
