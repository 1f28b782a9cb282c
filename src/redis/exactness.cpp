// SPDX-License-Identifier: Apache-2.0
#include "redis/exactness.hpp"

#include <cstdio>
#include <string>

#include "sluice/redis_backend.hpp"

namespace sluice {

result<void> detail::validate_for_redis(const policy& p) {
  if (p.algorithm == algorithm::token_bucket) {
    if (!p.rate.is_infinite() && p.rate.per_second > max_token_bucket_rate) {
      char rate[40];
      std::snprintf(rate, sizeof rate, "%.17g", p.rate.per_second);
      return {errc::invalid_argument, std::string("rate ") + rate +
                                          " per second is above the Redis backend's maximum of 1000000 per second "
                                          "(an interval under 1 µs); use an infinite rate for no limit"};
    }
    if (p.burst > max_exact_count) {
      return {errc::invalid_argument,
              "burst " + std::to_string(p.burst) + " is above the Redis backend's maximum of 2^53"};
    }
    return {};
  }
  if (p.limit > max_exact_count) {
    return {errc::invalid_argument,
            "limit " + std::to_string(p.limit) + " is above the Redis backend's maximum of 2^53"};
  }
  return {};
}

result<void> validate_for_redis(const rule& r) {
  if (auto v = detail::validate_for_redis(r.limit); !v)
    return {v.error().code, "rule '" + r.name + "': " + v.error().message};
  if (r.tenant) {
    if (auto v = detail::validate_for_redis(*r.tenant); !v) {
      return {v.error().code, "rule '" + r.name + "' tenant layer: " + v.error().message};
    }
  }
  return {};
}

}  // namespace sluice
