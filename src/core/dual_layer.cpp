// SPDX-License-Identifier: Apache-2.0
#include "sluice/dual_layer.hpp"

namespace sluice {

result<dual_layer> dual_layer::create(const options& o) {
  if (auto v = validate(o.tenant); !v) return error(v.error().code, "tenant layer: " + v.error().message);
  if (auto v = validate(o.user); !v) return error(v.error().code, "user layer: " + v.error().message);
  if (o.clock == nullptr) return {errc::invalid_argument, "clock must not be null"};
  return dual_layer(o);
}

dual_layer::dual_layer(const options& o)
    : tenant_policy_(o.tenant),
      user_policy_(o.user),
      tenant_params_(compiled_policy::from(o.tenant)),
      user_params_(compiled_policy::from(o.user)),
      tenant_(limiter_state::make(tenant_params_)),
      user_(limiter_state::make(user_params_)),
      clock_(o.clock) {}

dual_layer::dual_layer(dual_layer&& other) noexcept
    : tenant_policy_(other.tenant_policy_),
      user_policy_(other.user_policy_),
      tenant_params_(other.tenant_params_),
      user_params_(other.user_params_),
      tenant_(std::move(other.tenant_)),
      user_(std::move(other.user_)),
      clock_(other.clock_) {}

result<decision> dual_layer::try_acquire(time_point now, std::int64_t cost) {
  if (auto c = validate_cost(tenant_policy_, cost); !c)
    return error(c.error().code, "tenant layer: " + c.error().message);
  if (auto c = validate_cost(user_policy_, cost); !c) return error(c.error().code, "user layer: " + c.error().message);
  std::lock_guard lock(mutex_);
  return check_dual_layer(tenant_, tenant_params_, user_, user_params_, to_ns(now), cost);
}

}  // namespace sluice
