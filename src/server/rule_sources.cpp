#include "server/rule_sources.hpp"

#include <set>

#include "sluice/server/config.hpp"

namespace sluice::server {

etcd_rules::etcd_rules(std::string prefix, std::function<result<void>(const rule&)> check)
    : prefix_(std::move(prefix)), check_(std::move(check)) {}

std::vector<rejected_value> etcd_rules::apply(const std::vector<etcd_value>& values, bool& changed) {
  constexpr std::string_view rules_dir = "rules/";
  std::vector<rejected_value> rejected;
  std::map<std::string, entry, std::less<>> next;
  std::set<std::string, std::less<>> seen;  // full keys present now
  auto reject = [&](std::string key, std::int64_t revision, std::string reason) {
    auto [it, fresh] = reported_.try_emplace(key, revision);
    if (!fresh && it->second == revision) return;  // this version was reported already
    it->second = revision;
    rejected.push_back({std::move(key), revision, std::move(reason)});
  };
  for (const etcd_value& v : values) {
    std::string key = prefix_ + std::string(v.key);
    seen.insert(key);
    if (!v.key.starts_with(rules_dir)) {
      reject(std::move(key), v.mod_revision, "unknown key: rules are under " + prefix_ + "rules/NAME");
      continue;
    }
    const std::string_view name = v.key.substr(rules_dir.size());
    auto before = rules_.find(name);
    if (before != rules_.end() && before->second.mod_revision == v.mod_revision) {
      next.insert(*before);  // the same version: nothing to read again
      continue;
    }
    const std::string source = "etcd " + key + " (mod_revision " + std::to_string(v.mod_revision) + ")";
    result<rule> r = next.size() >= max_rules
                         ? result<rule>(error(errc::config_invalid, source + ": more than " +
                                                                         std::to_string(max_rules) + " rules in etcd"))
                         : parse_rule_json(name, v.value, source);
    if (r) {
      if (auto ok = check_(*r); !ok) r = error(ok.error().code, source + ": " + ok.error().message);
    }
    if (!r) {
      reject(std::move(key), v.mod_revision, r.error().message);
      if (before != rules_.end()) next.insert(*before);  // the previous version stays in force
      continue;
    }
    reported_.erase(key);
    next.emplace(std::string(name), entry{std::move(*r), std::move(key), v.mod_revision});
  }
  std::erase_if(reported_, [&](const auto& kv) { return !seen.contains(kv.first); });
  changed = next.size() != rules_.size();
  for (auto a = next.begin(), b = rules_.begin(); !changed && a != next.end(); ++a, ++b) {
    changed = a->first != b->first || a->second.mod_revision != b->second.mod_revision;
  }
  rules_ = std::move(next);
  return rejected;
}

merged_rules merge_rules(const std::vector<rule>& file_rules, const etcd_rules* etcd) {
  merged_rules out;
  out.rules.reserve(file_rules.size());
  for (const rule& r : file_rules) {
    const etcd_rules::entry* e = nullptr;
    if (etcd != nullptr) {
      if (auto it = etcd->rules().find(r.name); it != etcd->rules().end()) e = &it->second;
    }
    if (e != nullptr) {
      out.rules.push_back(e->definition);
      out.origins.push_back({"etcd", e->key, e->mod_revision});
    } else {
      out.rules.push_back(r);
      out.origins.push_back({"file", "", 0});
    }
  }
  if (etcd == nullptr) return out;
  for (const auto& [name, e] : etcd->rules()) {
    bool in_file = false;
    for (const rule& r : file_rules) in_file = in_file || r.name == name;
    if (in_file) continue;
    out.rules.push_back(e.definition);
    out.origins.push_back({"etcd", e.key, e.mod_revision});
  }
  return out;
}

}  // namespace sluice::server
