// SPDX-License-Identifier: Apache-2.0
// The backend interface's shared parts: the one validation of every request, and the default
// prepare().
#include "sluice/backend.hpp"

#include <string>
#include <string_view>
#include <utility>

namespace sluice {

result<void> backend::validate_rule(const rule& r) const { return validate(r); }

result<prepared_rule_ptr> backend::prepare(const rule& r) {
  if (auto v = validate_rule(r); !v) return v.error();
  return prepared_rule_ptr(std::make_shared<prepared_rule>(r, this));
}

result<prepared_rule_ptr> backend::prepare_change(const rule& r, const prepared_rule& /*previous*/) {
  return prepare(r);
}

result<prepared_rule_ptr> backend::prepare_override(const rule& r, const prepared_rule& /*base*/) { return prepare(r); }

result<decision> backend::check(const check_request& req) {
  if (auto v = validate(req, *this); !v) return v.error();
  return decide(req);
}

void backend::async_check(const check_request& req, check_handler handler) {
  if (!handler) handler = [](result<decision>) {};
  if (auto v = validate(req, *this); !v) return handler(v.error());
  async_decide(req, std::move(handler));
}

result<std::vector<decision>> backend::check_all(std::span<const check_request> checks) {
  if (auto v = validate_all(checks, *this); !v) return v.error();
  return decide_all(checks);
}

void backend::async_check_all(std::span<const check_request> checks, check_all_handler handler) {
  if (!handler) handler = [](result<std::vector<decision>>) {};
  if (auto v = validate_all(checks, *this); !v) return handler(v.error());
  async_decide_all(checks, std::move(handler));
}

result<void> backend::reset(const check_request& req) {
  if (auto v = validate_reset(req, *this); !v) return v;
  return forget(req);
}

void backend::async_reset(const check_request& req, reset_handler handler) {
  if (!handler) handler = [](result<void>) {};
  if (auto v = validate_reset(req, *this); !v) return handler(v);
  async_forget(req, std::move(handler));
}

result<void> backend::forget(const check_request& /*req*/) {
  return {errc::invalid_argument, "this backend keeps no state a reset could forget"};
}

void backend::async_forget(const check_request& req, reset_handler handler) { handler(forget(req)); }

namespace {

// The steps a check and a reset share. `what` names the request in errors ("check", "reset").
result<void> validate_rule_of(const check_request& req, const backend& b, std::string_view what) {
  if (req.rule == nullptr) return {errc::invalid_argument, std::string(what) + " has no rule"};
  if (req.rule->owner() != &b) {
    return {errc::invalid_argument, std::string(what) + " of a rule prepared by another backend"};
  }
  return {};
}

// The ids the rule's layers are keyed on: present and not too long. A reset of a dual-layer rule
// may name the tenant alone (`user_optional`).
result<void> validate_ids(const check_request& req, bool user_optional) {
  const rule& r = req.definition();
  if (r.tenant) {
    if (req.tenant.empty())
      return {errc::invalid_argument, "tenant must not be empty for dual-layer rule '" + r.name + "'"};
    if (req.user.empty() && !user_optional)
      return {errc::invalid_argument, "user must not be empty for dual-layer rule '" + r.name + "'"};
    if (auto v = validate_key(req.tenant, "tenant"); !v) return v;
    return req.user.empty() ? result<void>{} : validate_key(req.user, "user");
  }
  if (req.key.empty()) return {errc::invalid_argument, "key must not be empty"};
  return validate_key(req.key, "key");
}

}  // namespace

result<void> validate_reset(const check_request& req, const backend& b) {
  if (auto v = validate_rule_of(req, b, "reset"); !v) return v;
  return validate_ids(req, /*user_optional=*/true);
}

result<void> validate(const check_request& req, const backend& b) {
  if (auto v = validate_rule_of(req, b, "check"); !v) return v;
  const rule& r = req.definition();
  const bool look = req.cost == 0;  // records nothing, whatever the limits
  if (auto v = validate_cost(r.limit, req.cost); !v && !look) return v;
  if (r.tenant) {
    if (auto v = validate_cost(*r.tenant, req.cost); !v && !look)
      return {v.error().code, "tenant layer: " + v.error().message};
  }
  return validate_ids(req, /*user_optional=*/false);
}

bool exceeds_capacity(const check_request& req) noexcept {
  return req.rule != nullptr && !req.definition().is_dual_layer() && exceeds_capacity(req.definition().limit, req.cost);
}

result<void> validate_all(std::span<const check_request> checks, const backend& b) {
  if (checks.empty()) return {errc::invalid_argument, "check_all needs at least one check"};
  if (checks.size() > max_checks_per_call) {
    return {errc::invalid_argument, "check_all takes at most " + std::to_string(max_checks_per_call) + " checks, got " +
                                        std::to_string(checks.size())};
  }
  for (std::size_t i = 0; i < checks.size(); ++i) {
    const check_request& c = checks[i];
    if (c.rule != nullptr && c.definition().is_dual_layer()) {
      return {errc::invalid_argument,
              "check_all takes single-layer rules; '" + c.definition().name + "' is dual-layer"};
    }
    if (c.cost == 0) return {errc::invalid_argument, "check_all does not look: a cost of 0 is for check()"};
    // A cost no wait admits is a refusal, not an error: the rest of the check must be valid.
    check_request rest = c;
    if (exceeds_capacity(c)) rest.cost = 1;
    if (auto v = validate(rest, b); !v) return v;
    for (std::size_t j = 0; j < i; ++j) {
      if (checks[j].definition().name == c.definition().name && checks[j].key == c.key) {
        return {errc::invalid_argument, "check_all: rule '" + c.definition().name + "' and one key are checked twice"};
      }
    }
  }
  return {};
}

}  // namespace sluice
