// SPDX-License-Identifier: Apache-2.0
#include "rules/rule_sources.hpp"

#include <set>

#include <spdlog/spdlog.h>

#include "core/log_value.hpp"
#include "sluice/server/config.hpp"

namespace sluice::server {

etcd_rules::etcd_rules(std::string prefix, std::function<result<void>(const rule&)> check)
    : prefix_(std::move(prefix)), check_(std::move(check)) {}

std::vector<rejected_value> etcd_rules::apply(const std::vector<etcd_value>& values, bool& changed) {
  constexpr std::string_view rules_dir = "rules/";
  constexpr std::string_view overrides_dir = "overrides/";
  std::vector<rejected_value> rejected;
  std::map<std::string, entry, std::less<>> next;
  std::map<std::string, override_entry, std::less<>> next_overrides;
  std::set<std::string, std::less<>> seen;  // full keys present now
  auto reject = [&](const std::string& key, std::int64_t revision, std::string reason) {
    auto [it, fresh] = reported_.try_emplace(key, revision);
    if (!fresh && it->second == revision) return;  // this version was reported already
    it->second = revision;
    rejected.push_back({key, revision, std::move(reason)});
  };
  // One value of a kind (rules, overrides): the same version is kept as it is; a new one is parsed,
  // and when it fails the previous version stays in force and the failure is reported.
  auto take = [&](const auto& current, auto& next, std::string_view id, std::size_t max, std::string_view what,
                  const std::string& key, const etcd_value& v, auto parse) {
    const std::int64_t revision = v.mod_revision;
    const auto before = current.find(id);
    if (before != current.end() && before->second.mod_revision == revision) {
      next.insert(*before);  // the same version: nothing to read again
      return;
    }
    const std::string source = "etcd " + key + " (mod_revision " + std::to_string(revision) + ")";
    auto made = [&]() -> decltype(parse(source)) {
      if (next.size() >= max) {
        return error(errc::config_invalid,
                     source + ": more than " + std::to_string(max) + " " + std::string(what) + " in etcd");
      }
      if (!v.left_out.empty()) return error(errc::config_invalid, source + ": " + v.left_out);  // over a bound
      return parse(source);
    }();
    if (!made) {
      reject(key, revision, made.error().message);
      if (before != current.end()) next.insert(*before);
      return;
    }
    reported_.erase(key);
    next.emplace(std::string(id), std::move(*made));
  };
  // Keys in force are taken first, so that the caps count them before any new key: a new key never
  // takes the place of one in force, and one in force never goes in over a cap new keys filled.
  auto in_force = [&](std::string_view sub) {
    if (sub.starts_with(overrides_dir)) return overrides_.contains(sub.substr(overrides_dir.size()));
    return sub.starts_with(rules_dir) && rules_.contains(sub.substr(rules_dir.size()));
  };
  for (const bool first : {true, false}) {
    for (const etcd_value& v : values) {
      if (in_force(v.key) != first) continue;
      const std::string_view sub = v.key;  // the key below the prefix
      const std::string key = prefix_ + v.key;
      seen.insert(key);
      if (sub.starts_with(overrides_dir)) {
        take(overrides_, next_overrides, sub.substr(overrides_dir.size()), max_overrides, "overrides", key, v,
             [&](const std::string& source) -> result<override_entry> {
               auto o = parse_override_json(v.value, source);
               if (!o) return o.error();
               return override_entry{std::move(*o), v.mod_revision};
             });
      } else if (sub.starts_with(rules_dir)) {
        const std::string_view name = sub.substr(rules_dir.size());
        take(rules_, next, name, max_rules, "rules", key, v, [&](const std::string& source) -> result<entry> {
          auto r = parse_rule_json(name, v.value, source);
          if (!r) return r.error();
          if (auto ok = check_(*r); !ok) return error(ok.error().code, source + ": " + ok.error().message);
          return entry{std::move(*r), key, v.mod_revision};
        });
      } else {
        reject(key, v.mod_revision,
               "unknown key: rules are under " + prefix_ + "rules/NAME, overrides under " + prefix_ + "overrides/ID");
      }
    }
  }
  std::erase_if(reported_, [&](const auto& kv) { return !seen.contains(kv.first); });
  auto differ = [](const auto& x, const auto& y) {
    if (x.size() != y.size()) return true;
    for (auto a = x.begin(), b = y.begin(); a != x.end(); ++a, ++b) {
      if (a->first != b->first || a->second.mod_revision != b->second.mod_revision) return true;
    }
    return false;
  };
  changed = differ(next, rules_) || differ(next_overrides, overrides_);
  rules_ = std::move(next);
  overrides_ = std::move(next_overrides);
  return rejected;
}

std::vector<rule_override> merge_overrides(const std::vector<rule_override>& file_overrides, const etcd_rules* etcd) {
  if (etcd == nullptr || etcd->overrides().empty()) return file_overrides;
  std::map<std::string, const rule_override*> from_etcd;  // by target
  for (const auto& [id, e] : etcd->overrides()) from_etcd.emplace(e.value.target(), &e.value);
  std::vector<rule_override> out;
  for (const rule_override& o : file_overrides) {
    if (!from_etcd.contains(o.target())) out.push_back(o);
  }
  for (const auto& [id, e] : etcd->overrides()) out.push_back(e.value);
  return out;
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

bool follow_etcd(etcd_rules& rules, const std::vector<etcd_value>& values, const rule_source_status& now,
                 const rule_source_status& before, std::atomic<std::uint64_t>& errors) {
  if (now.connected && !before.connected) {
    spdlog::info("event=config_source_up source=etcd revision={}", now.revision);
  } else if (!now.connected && (before.connected || before.detail.empty())) {  // lost, or down since the start
    spdlog::warn("event=config_source_down source=etcd error={}", log_value(now.detail));
  }
  bool changed = false;
  for (const rejected_value& r : rules.apply(values, changed)) {
    errors.fetch_add(1, std::memory_order_relaxed);
    spdlog::error("event=config_rejected source=etcd key={} mod_revision={} error={}", log_value(r.key), r.mod_revision,
                  log_value(r.reason));
  }
  return changed;
}

}  // namespace sluice::server
