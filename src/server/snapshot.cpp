// SPDX-License-Identifier: Apache-2.0
#include "server/snapshot.hpp"

#include <algorithm>
#include <map>

namespace sluice::server {

const prepared_rule& snapshot::prepared_for(const check_item& item) const {
  const std::size_t i = item.rule_index;
  const override_map& own = overrides[i];
  if (!own.empty()) {
    if (!item.rule->is_dual_layer()) {
      if (auto it = own.find(std::string_view(item.key)); it != own.end()) return *it->second;
    } else {
      if (auto it = own.find(detail::pair_key(item.tenant, item.user)); it != own.end()) return *it->second;
      if (auto it = own.find(std::string_view(item.tenant)); it != own.end()) return *it->second;
    }
  }
  return *rules->rules()[i];
}

result<built_snapshot> make_snapshot(config cfg, std::vector<rule_origin> origins, backend& b,
                                     const snapshot* previous) {
  if (origins.empty()) origins.assign(cfg.rules.size(), rule_origin{.source = "file"});
  auto rules = rule_set::build(b, cfg.rules, {.source = cfg.source}, previous ? previous->rules.get() : nullptr);
  if (!rules) return rules.error();
  built_snapshot out;
  auto s = std::make_shared<snapshot>();
  s->overrides.resize(cfg.rules.size());
  std::vector<rule_override> kept;
  // Tenants' overrides first: a tenant's user's override starts from its tenant's limits.
  std::stable_partition(cfg.overrides.begin(), cfg.overrides.end(),
                        [](const rule_override& o) { return o.user.empty(); });
  std::map<std::pair<std::size_t, std::string>, rule> tenant_rules;  // (rule index, tenant) → its rule
  for (rule_override& o : cfg.overrides) {
    if (kept.size() == max_overrides) {
      out.rejected_overrides.push_back(o.source + ": more than " + std::to_string(max_overrides) +
                                       " overrides in force (file and etcd together)");
      continue;
    }
    const std::size_t i = (*rules)->position(o.rule);
    if (i == rule_set::npos) {
      out.rejected_overrides.push_back(o.source + ": names no rule in force: \"" + o.rule + "\"");
      continue;
    }
    const rule* base = &cfg.rules[i];
    if (!o.user.empty()) {
      if (auto it = tenant_rules.find({i, o.tenant}); it != tenant_rules.end()) base = &it->second;
    }
    auto r = apply_override(*base, o);
    result<prepared_rule_ptr> p =
        r ? b.prepare_override(*r, *(*rules)->rules()[i]) : result<prepared_rule_ptr>(r.error());
    if (!p) {
      out.rejected_overrides.push_back(p.error().message);
      continue;
    }
    std::string key = !o.key.empty() ? o.key : o.user.empty() ? o.tenant : detail::pair_key(o.tenant, o.user);
    if (!s->overrides[i].emplace(std::move(key), std::move(*p)).second) {
      out.rejected_overrides.push_back(o.source + ": another override in force has the same rule and key");
      continue;
    }
    if (!o.tenant.empty() && o.user.empty()) tenant_rules.emplace(std::pair{i, o.tenant}, *r);
    kept.push_back(std::move(o));
  }
  cfg.overrides = std::move(kept);
  s->override_count = cfg.overrides.size();
  s->headers = {.legacy_fields = cfg.http.legacy_headers, .ietf_fields = cfg.http.ietf_headers};
  s->cfg = std::move(cfg);
  s->origins = std::move(origins);
  s->rules = std::move(*rules);
  out.snap = std::move(s);
  return out;
}

}  // namespace sluice::server
