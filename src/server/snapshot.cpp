#include "server/snapshot.hpp"

namespace sluice::server {

std::string tenant_user_key(std::string_view tenant, std::string_view user) {
  std::string k = std::to_string(tenant.size());
  k += ':';
  k += tenant;
  k += user;
  return k;
}

const prepared_rule& snapshot::prepared_for(const check_item& item) const {
  const std::size_t i = index_of(*item.rule);
  const override_map& own = overrides[i];
  if (!own.empty()) {
    if (!item.rule->is_dual_layer()) {
      if (auto it = own.find(std::string_view(item.key)); it != own.end()) return *it->second;
    } else {
      if (auto it = own.find(tenant_user_key(item.tenant, item.user)); it != own.end()) return *it->second;
      if (auto it = own.find(std::string_view(item.tenant)); it != own.end()) return *it->second;
    }
  }
  return *rules->rules()[i];
}

namespace {

// The override's rule prepared: the previous snapshot's when unchanged, carried over when its
// limits changed, else new.
result<prepared_rule_ptr> prepare_override(backend& b, const rule& r, const std::string& target,
                                           const snapshot* previous) {
  if (previous != nullptr) {
    if (auto it = previous->by_target.find(target); it != previous->by_target.end() && it->second->owner() == &b) {
      if (it->second->definition() == r) return it->second;
      return b.prepare_change(r, *it->second);
    }
  }
  return b.prepare(r);
}

}  // namespace

result<built_snapshot> make_snapshot(config cfg, std::vector<rule_origin> origins, backend& b,
                                     const snapshot* previous) {
  if (origins.empty()) origins.assign(cfg.rules.size(), rule_origin{.source = "file"});
  auto rules = rule_set::build(b, cfg.rules, {.source = cfg.source}, previous ? previous->rules.get() : nullptr);
  if (!rules) return rules.error();
  built_snapshot out;
  auto s = std::make_shared<snapshot>();
  s->overrides.resize(cfg.rules.size());
  std::vector<rule_override> kept;
  for (rule_override& o : cfg.overrides) {
    const rule* base = cfg.find_rule(o.rule);
    if (base == nullptr) {
      out.rejected_overrides.push_back(o.source + ": names no rule in force: \"" + o.rule + "\"");
      continue;
    }
    auto r = apply_override(*base, o);
    std::string target = o.target();
    result<prepared_rule_ptr> p = r ? prepare_override(b, *r, target, previous) : result<prepared_rule_ptr>(r.error());
    if (!p) {
      out.rejected_overrides.push_back(p.error().message);
      continue;
    }
    const std::size_t i = static_cast<std::size_t>(base - cfg.rules.data());
    std::string key = !o.key.empty() ? o.key : o.user.empty() ? o.tenant : tenant_user_key(o.tenant, o.user);
    s->overrides[i].emplace(std::move(key), *p);
    s->by_target.emplace(std::move(target), std::move(*p));
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
