// The backend interface's shared parts: request validation and the default prepare().
#include "sluice/backend.hpp"

namespace sluice {

result<prepared_rule_ptr> backend::prepare(const rule& r) {
  if (auto v = validate(r); !v) return v.error();
  return prepared_rule_ptr(std::make_shared<prepared_rule>(r, this));
}

result<prepared_rule_ptr> backend::prepare_change(const rule& r, const prepared_rule& /*previous*/) {
  return prepare(r);
}

result<prepared_rule_ptr> backend::prepare_override(const rule& r, const prepared_rule& /*base*/) { return prepare(r); }

result<void> validate(const check_request& req) {
  if (req.rule == nullptr) return {errc::invalid_argument, "check has no rule"};
  const rule& r = *req.rule;
  if (auto v = validate_cost(r.limit, req.cost); !v) return v;
  if (r.tenant) {
    if (auto v = validate_cost(*r.tenant, req.cost); !v) return {v.error().code, "tenant layer: " + v.error().message};
    if (req.tenant.empty())
      return {errc::invalid_argument, "tenant must not be empty for dual-layer rule '" + r.name + "'"};
    if (req.user.empty())
      return {errc::invalid_argument, "user must not be empty for dual-layer rule '" + r.name + "'"};
    if (auto v = validate_key(req.tenant, "tenant"); !v) return v;
    return validate_key(req.user, "user");
  }
  if (req.key.empty()) return {errc::invalid_argument, "key must not be empty"};
  return validate_key(req.key, "key");
}

}  // namespace sluice
