// SPDX-License-Identifier: Apache-2.0
#include "sluice/decision.hpp"

#include <algorithm>

namespace sluice {

decision combine_layers(const decision& tenant, const decision& user) noexcept {
  decision d;
  d.dual_layer = true;
  d.allowed = tenant.allowed && user.allowed;
  d.tenant = {tenant.limit, tenant.remaining};
  d.user = {user.limit, user.remaining};
  if (!d.allowed) d.rejected_by = tenant.allowed ? layer::user : layer::tenant;
  d.binding =
      d.rejected_by != layer::none ? d.rejected_by : (tenant.remaining < user.remaining ? layer::tenant : layer::user);
  d.limit = d.binding == layer::tenant ? tenant.limit : user.limit;
  d.remaining = std::min(tenant.remaining, user.remaining);
  if (!d.allowed) {
    d.retry_after = std::max(tenant.allowed ? nanoseconds::zero() : tenant.retry_after,
                             user.allowed ? nanoseconds::zero() : user.retry_after);
  }
  d.reset_after = std::max(tenant.reset_after, user.reset_after);
  return d;
}

decision looked(decision d) noexcept {
  if (!d.allowed) return d;  // a refusal reports the key as it stands
  auto before = [](std::int64_t remaining, std::int64_t limit) { return remaining < limit ? remaining + 1 : limit; };
  d.remaining = before(d.remaining, d.limit);
  if (d.dual_layer) {
    d.tenant.remaining = before(d.tenant.remaining, d.tenant.limit);
    d.user.remaining = before(d.user.remaining, d.user.limit);
  }
  return d;
}

std::string_view to_string(layer l) noexcept {
  switch (l) {
    case layer::none: return "none";
    case layer::tenant: return "tenant";
    case layer::user: return "user";
  }
  return "none";
}

std::string_view to_string(decision_source s) noexcept {
  switch (s) {
    case decision_source::limiter: return "limiter";
    case decision_source::fail_open: return "fail_open";
    case decision_source::fail_closed: return "fail_closed";
    case decision_source::local_fallback: return "local_fallback";
    case decision_source::disabled: return "disabled";
  }
  return "limiter";
}

}  // namespace sluice
