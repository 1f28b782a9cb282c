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

bool exceeds_capacity(const check_request& req) noexcept {
  return req.rule != nullptr && !req.rule->is_dual_layer() && exceeds_capacity(req.rule->limit, req.cost);
}

result<void> validate_all(std::span<const check_request> checks) {
  if (checks.empty()) return {errc::invalid_argument, "check_all needs at least one check"};
  if (checks.size() > max_checks_per_call) {
    return {errc::invalid_argument, "check_all takes at most " + std::to_string(max_checks_per_call) + " checks, got " +
                                        std::to_string(checks.size())};
  }
  for (std::size_t i = 0; i < checks.size(); ++i) {
    const check_request& c = checks[i];
    if (c.rule != nullptr && c.rule->is_dual_layer())
      return {errc::invalid_argument, "check_all takes single-layer rules; '" + c.rule->name + "' is dual-layer"};
    // A cost no wait admits is a refusal, not an error: the rest of the check must be valid.
    check_request rest = c;
    if (exceeds_capacity(c)) rest.cost = 1;
    if (auto v = validate(rest); !v) return v;
    for (std::size_t j = 0; j < i; ++j) {
      if (checks[j].rule->name == c.rule->name && checks[j].key == c.key)
        return {errc::invalid_argument, "check_all: rule '" + c.rule->name + "' and one key are checked twice"};
    }
  }
  return {};
}

}  // namespace sluice
