// SPDX-License-Identifier: Apache-2.0
// JSON request parsing and reply rendering for POST /v1/check (nlohmann-json, no exceptions).
#include "server/api.hpp"

#include <algorithm>
#include <limits>

#include <nlohmann/json.hpp>

#include "sluice/http/headers.hpp"

namespace sluice::server {

namespace {

using json = nlohmann::json;

api_error invalid(std::string message) { return {400, "invalid_request", std::move(message)}; }

// Reads a string field; absent → nullopt with no error.
std::optional<api_error> read_string(const json& obj, const char* field, std::string& out, bool& present) {
  auto it = obj.find(field);
  present = it != obj.end();
  if (!present) return std::nullopt;
  if (!it->is_string()) return invalid(std::string(field) + " must be a string");
  out = it->get_ref<const std::string&>();
  return std::nullopt;
}

// Parses one check object: its shape, the rule named and the keys it takes. Never touches a backend.
// A reset's takes no cost, and a dual-layer rule's names its tenant and, for a user's layer, the user.
check_item parse_item(const json& j, const rule_set& rules, const rule_resolver& resolve, bool reset = false) {
  check_item item;
  auto fail = [&](api_error e) {
    item.error = std::move(e);
    return item;
  };
  if (!j.is_object()) return fail(invalid("a check must be a JSON object"));
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    if (k != "rule" && k != "key" && k != "tenant" && k != "user" && (k != "cost" || reset)) {
      return fail(invalid("unknown field \"" + k + "\" (expected rule, key, tenant, user" + (reset ? ")" : ", cost)")));
    }
  }
  std::string rule_name = "default";
  bool has_rule = false, has_key = false, has_tenant = false, has_user = false;
  if (auto e = read_string(j, "rule", rule_name, has_rule)) return fail(*e);
  if (auto e = read_string(j, "key", item.key, has_key)) return fail(*e);
  if (auto e = read_string(j, "tenant", item.tenant, has_tenant)) return fail(*e);
  if (auto e = read_string(j, "user", item.user, has_user)) return fail(*e);
  if (auto it = j.find("cost"); it != j.end()) {
    if (it->is_number_unsigned()) {
      auto v = it->get<std::uint64_t>();
      if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        return fail(invalid("cost is too large"));
      }
      item.cost = static_cast<std::int64_t>(v);
    } else if (it->is_number_integer()) {
      item.cost = it->get<std::int64_t>();
    } else {
      return fail(invalid("cost must be an integer"));
    }
  }
  item.rule_index = rules.position(rule_name);
  if (item.rule_index == rule_set::npos) {
    std::string shown = rule_name.size() > 64 ? rule_name.substr(0, 64) + "..." : rule_name;
    return fail({404, "unknown_rule", "no rule named \"" + shown + "\""});
  }
  item.prepared = rules.rules()[item.rule_index].get();
  item.rule = &item.prepared->definition();
  if (item.rule->is_dual_layer()) {
    if (has_key) return fail(invalid("rule \"" + item.rule->name + "\" is dual-layer: send tenant and user, not key"));
    if (!has_tenant) return fail(invalid("rule \"" + item.rule->name + "\" is dual-layer: tenant is missing"));
    if (!has_user && !reset) return fail(invalid("rule \"" + item.rule->name + "\" is dual-layer: user is missing"));
  } else {
    if (has_tenant || has_user) {
      return fail(invalid("rule \"" + item.rule->name + "\" is single-layer: send key, not tenant/user"));
    }
    if (!has_key) return fail(invalid("key is missing"));
  }
  if (resolve) {
    item.prepared = &resolve(item);  // an override's, or the same
    item.rule = &item.prepared->definition();
  }
  return item;
}

void append_int(std::string& out, std::int64_t v) { out += std::to_string(v); }

}  // namespace

namespace {

// A window as a config writes it: "60s", or "250ms" when not whole seconds.
std::string window_text(nanoseconds w) {
  using namespace std::chrono;
  if (w % seconds(1) == nanoseconds(0)) return std::to_string(duration_cast<seconds>(w).count()) + "s";
  return std::to_string(duration_cast<milliseconds>(w).count()) + "ms";
}

// A policy's window as a config writes it: its calendar period, or its length.
std::string window_text(const policy& p) {
  return p.calendar != calendar::none ? std::string(to_string(p.calendar)) : window_text(p.window);
}

json rule_json(const rule& r) {
  json j;
  j["name"] = r.name;
  j["algorithm"] = std::string(to_string(r.limit.algorithm));
  if (r.limit.algorithm == algorithm::token_bucket) {
    j["rate"] = r.limit.rate.per_second;
    j["burst"] = r.limit.burst;
  } else if (r.tenant) {
    j["tenant_limit"] = r.tenant->limit;
    j["user_limit"] = r.limit.limit;
    j["window"] = window_text(r.limit);
  } else {
    j["limit"] = r.limit.limit;
    j["window"] = window_text(r.limit);
  }
  j["when_full"] = r.when_full == when_full::refuse ? "refuse" : "evict";
  if (r.shadow) j["shadow"] = true;
  if (r.lease) {
    j["lease"] = window_text(r.lease->period);
    j["lease_max_share"] = r.lease->max_share;
  }
  return j;
}

}  // namespace

std::string render_rules(const std::vector<rule>& rules, const std::vector<rule_origin>& origins,
                         const std::vector<rule_override>& overrides, std::uint64_t version,
                         const std::vector<rule_source_status>& sources) {
  json out;
  out["version"] = version;
  json& list = out["rules"] = json::array();
  for (std::size_t i = 0; i < rules.size(); ++i) {
    json j = rule_json(rules[i]);
    const rule_origin& o = origins.at(i);
    j["source"] = o.source;
    if (!o.key.empty()) {
      j["key"] = o.key;
      j["mod_revision"] = o.mod_revision;
    }
    list.push_back(std::move(j));
  }
  out["overrides"] = overrides.size();
  json& in_force = out["override_list"] = json::array();
  for (const rule_override& o : overrides) {
    json j{{"rule", o.rule}, {"source", o.source}};
    if (!o.key.empty()) j["key"] = o.key;
    if (!o.tenant.empty()) j["tenant"] = o.tenant;
    if (!o.user.empty()) j["user"] = o.user;
    if (o.rate) j["rate"] = *o.rate;
    if (o.burst) j["burst"] = *o.burst;
    if (o.limit) j["limit"] = *o.limit;
    if (o.tenant_limit) j["tenant_limit"] = *o.tenant_limit;
    if (o.user_limit) j["user_limit"] = *o.user_limit;
    in_force.push_back(std::move(j));
  }
  json& src = out["sources"] = json::array();
  for (const rule_source_status& s : sources) {
    json rejected = json::array();
    for (const rejected_value& r : s.rejected) {
      rejected.push_back({{"key", r.key}, {"mod_revision", r.mod_revision}, {"error", r.reason}});
    }
    src.push_back({{"name", s.name},
                   {"connected", s.connected},
                   {"revision", s.revision},
                   {"detail", s.detail},
                   {"rejected", std::move(rejected)}});
  }
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::variant<check_batch, api_error> parse_check_body(std::string_view body, const rule_set& rules,
                                                      const rule_resolver& resolve) {
  if (body.size() > max_body_bytes) {
    return api_error{413, "payload_too_large", "the body is larger than " + std::to_string(max_body_bytes) + " bytes"};
  }
  json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid("the body is not valid JSON");
  if (!j.is_object()) return invalid("the body must be a JSON object");
  check_batch out;
  if (auto it = j.find("checks"); it != j.end()) {
    if (j.size() != 1) return invalid("a batch body holds only \"checks\"");
    if (!it->is_array()) return invalid("checks must be an array");
    if (it->empty()) return invalid("checks must not be empty");
    if (it->size() > max_batch_checks) {
      return invalid("checks holds more than " + std::to_string(max_batch_checks) + " entries");
    }
    out.batch = true;
    out.items.reserve(it->size());
    for (const json& e : *it) out.items.push_back(parse_item(e, rules, resolve));
    return out;
  }
  check_item item = parse_item(j, rules, resolve);
  if (item.error) return std::move(*item.error);
  out.items.push_back(std::move(item));
  return out;
}

std::variant<check_item, api_error> parse_reset_body(std::string_view body, const rule_set& rules) {
  if (body.size() > max_body_bytes) {
    return api_error{413, "payload_too_large", "the body is larger than " + std::to_string(max_body_bytes) + " bytes"};
  }
  json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid("the body is not valid JSON");
  if (!j.is_object()) return invalid("the body must be a JSON object");
  check_item item = parse_item(j, rules, {}, /*reset=*/true);
  if (item.error) return std::move(*item.error);
  return item;
}

decision shadow_admitted(decision d) noexcept {
  d.allowed = true;
  d.retry_after = nanoseconds(0);
  return d;
}

std::string render_decision(const sluice::rule& r, const decision& d, bool shadow_rejected) {
  std::string out;
  out.reserve(160);
  out += d.allowed ? R"({"allowed":true,"rule":)" : R"({"allowed":false,"rule":)";
  out += json(r.name).dump();
  out += R"(,"limit":)";
  append_int(out, d.limit);
  out += R"(,"remaining":)";
  append_int(out, d.remaining < 0 ? 0 : d.remaining);
  out += R"(,"retry_after_ms":)";
  append_int(out, sluice::http::retry_after_milliseconds(d));
  out += R"(,"reset_after_ms":)";
  append_int(out, sluice::http::ceil_milliseconds(d.reset_after));
  if (d.dual_layer) {
    out += R"(,"layers":{"tenant":{"limit":)";
    append_int(out, d.tenant.limit);
    out += R"(,"remaining":)";
    append_int(out, d.tenant.remaining < 0 ? 0 : d.tenant.remaining);
    out += R"(},"user":{"limit":)";
    append_int(out, d.user.limit);
    out += R"(,"remaining":)";
    append_int(out, d.user.remaining < 0 ? 0 : d.user.remaining);
    out += "}}";
    if ((!d.allowed || shadow_rejected) && d.rejected_by != layer::none) {
      out += R"(,"rejected_by":")";
      out += to_string(d.rejected_by);
      out += '"';
    }
  }
  if (shadow_rejected) out += R"(,"shadow_rejected":true)";
  if (d.source != decision_source::limiter) {
    out += R"(,"source":")";
    out += to_string(d.source);
    out += '"';
  }
  out += '}';
  return out;
}

std::string render_error(const api_error& e) {
  json j = {{"error", {{"code", e.code}, {"message", e.message}}}};
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

api_error api_error_of(const error& e) {
  if (e.code == condition::invalid_request) return {400, "invalid_request", e.message};
  // A rule with when_full = "refuse" at its key cap: this caller is refused, as by a limit.
  if (e == errc::capacity_exhausted) return {429, "capacity_exhausted", e.message};
  std::string code = "backend_unavailable";
  if (e == errc::backend_timeout) code = "backend_timeout";
  if (e == errc::backend_overloaded) code = "backend_overloaded";
  return {503, code, e.message};
}

decision disabled_decision(const sluice::rule& r) noexcept {
  return full_capacity_decision(r, decision_source::disabled);
}

}  // namespace sluice::server
