// SPDX-License-Identifier: Apache-2.0
#include "envoy/rls_rules.hpp"

#include "sluice/prometheus.hpp"

namespace sluice::envoy {

void append_name_part(std::string& out, std::string_view s) {
  static constexpr char hex[] = "0123456789ABCDEF";
  for (char c : s) {
    if (c == '/' || c == '=' || c == '#' || c == '%') {
      out += '%';
      out += hex[static_cast<unsigned char>(c) >> 4];
      out += hex[static_cast<unsigned char>(c) & 0xf];
    } else {
      out += c;
    }
  }
}

bool wildcard_match(const wildcard_parts& parts, std::string_view v) noexcept {
  if (parts.size() == 1) return v == parts.front();
  const std::string& first = parts.front();
  const std::string& last = parts.back();
  if (v.size() < first.size() + last.size() || !v.starts_with(first) || !v.ends_with(last)) return false;
  // The middle parts in order, each at its first place after the one before.
  std::string_view rest = v.substr(first.size(), v.size() - first.size() - last.size());
  for (std::size_t i = 1; i + 1 < parts.size(); ++i) {
    const std::size_t at = rest.find(parts[i]);
    if (at == std::string_view::npos) return false;
    rest.remove_prefix(at + parts[i].size());
  }
  return true;
}

namespace {

// "a*b*" -> {"a", "b", ""}.
wildcard_parts split_at_stars(std::string_view s) {
  wildcard_parts parts;
  for (;;) {
    const std::size_t star = s.find('*');
    parts.emplace_back(s.substr(0, star));
    if (star == std::string_view::npos) return parts;
    s.remove_prefix(star + 1);
  }
}

struct builder {
  const std::string& domain;
  counter_registry& counters;
  std::vector<rule>& rules;
  // Per limit with a rule: where its prepared form goes once the set is built.
  std::vector<std::pair<rls_limit*, std::string>> pending;

  void add(rls_node& node, descriptor_config& d, const std::string& rule_prefix, const std::string& parent_path) {
    const std::string lookup = d.value.empty() ? d.key : d.key + "_" + d.value;
    node.path = parent_path.empty() ? lookup : parent_path + "." + lookup;
    node.shadow_mode = d.shadow_mode;
    node.quota_mode = d.quota_mode;
    node.detailed_metric = d.detailed_metric;
    node.share_threshold = d.share_threshold;
    node.value_to_metric = d.value_to_metric;
    node.value = d.value;
    node.counters = &counters.of(domain, node.path);
    std::string prefix = rule_prefix;
    prefix += '/';
    append_name_part(prefix, d.key);
    if (!d.value.empty()) {
      prefix += '=';
      append_name_part(prefix, d.value);
    }
    node.limits.reserve(d.limits.size());  // `pending` points into it
    for (std::size_t i = 0; i < d.limits.size(); ++i) {
      node.limits.push_back({.config = std::move(d.limits[i])});
      if (node.limits.back().config.unlimited) continue;
      std::string name = prefix + "#" + std::to_string(i + 1);
      rules.push_back({.name = name, .limit = node.limits.back().config.to_policy()});
      pending.emplace_back(&node.limits.back(), std::move(name));
    }
    for (descriptor_config& child : d.descriptors) add_child(node, child, prefix);
  }

  void add_child(rls_node& parent, descriptor_config& d, const std::string& rule_prefix) {
    auto child = std::make_unique<rls_node>();
    rls_node* raw = child.get();
    const bool wildcard = d.value.find('*') != std::string::npos;
    // Looked up as "key_value" (or "key"), as envoyproxy/ratelimit does: key "a_b" and key "a" with
    // value "b" would be one entry.
    const std::string lookup = d.value.empty() ? d.key : d.key + "_" + d.value;
    if (!parent.children.emplace(lookup, std::move(child)).second) {  // a wildcard's is owned here too
      throw error(errc::config_invalid, d.where + ": descriptor '" + lookup + "' is looked up as another one is");
    }
    if (wildcard) parent.wildcards.emplace_back(split_at_stars(lookup), raw);
    add(*raw, d, rule_prefix, parent.path);
  }
};

}  // namespace

descriptor_counters& counter_registry::of(const std::string& domain, const std::string& path) {
  std::lock_guard lock(mutex_);
  auto& slot = counters_[{domain, path}];
  if (!slot) slot = std::make_unique<descriptor_counters>();
  return *slot;
}

descriptor_counters& counter_registry::detailed(const std::string& domain, const std::string& path,
                                                descriptor_counters& fallback) {
  std::lock_guard lock(mutex_);
  auto it = counters_.find({domain, path});
  if (it != counters_.end()) return *it->second;
  if (detailed_count_ >= max_detailed_) return fallback;
  ++detailed_count_;
  auto& slot = counters_[{domain, path}];
  slot = std::make_unique<descriptor_counters>();
  return *slot;
}

void counter_registry::append_metrics(std::string& out) const {
  struct family {
    const char* name;
    const char* help;
    std::atomic<std::uint64_t> descriptor_counters::*field;
  };
  static constexpr family families[] = {
      {"sluice_envoy_hits_total", "Units asked of each Envoy descriptor's limits (hits_addend).",
       &descriptor_counters::hits},
      {"sluice_envoy_over_limit_total",
       "Units past each descriptor's limit (shadow_mode ones included): of a request that crossed it, only those past.",
       &descriptor_counters::over_limit},
      {"sluice_envoy_within_limit_total", "Units admitted, by descriptor.", &descriptor_counters::within_limit},
      {"sluice_envoy_near_limit_total", "Units past near_limit_ratio of each descriptor's limit and within it.",
       &descriptor_counters::near_limit},
      {"sluice_envoy_shadow_mode_total", "Units over the limit of a shadow_mode descriptor, answered OK.",
       &descriptor_counters::shadow_mode},
  };
  std::lock_guard lock(mutex_);
  for (const family& f : families) {
    prometheus::family(out, f.name, "counter", f.help);
    for (const auto& [where, c] : counters_) {
      prometheus::sample(out,
                         std::string(f.name) + "{domain=\"" + prometheus::escape_label(where.first) +
                             "\",descriptor=\"" + prometheus::escape_label(where.second) + "\"}",
                         ((*c).*f.field).load(std::memory_order_relaxed));
    }
  }
}

result<std::shared_ptr<const rls_rules>> rls_rules::build(std::vector<domain_config> domains, backend& b,
                                                          const rls_rules* previous, counter_registry& counters) {
  auto out = std::shared_ptr<rls_rules>(new rls_rules());
  std::vector<rule> rules;
  std::vector<std::pair<rls_limit*, std::string>> pending;
  std::vector<std::string> where;  // per rule: the file and line of its limit
  for (domain_config& d : domains) {
    auto dom = std::make_unique<rls_domain>();
    dom->name = d.domain;
    builder bld{dom->name, counters, rules, {}};
    const std::string prefix = [&] {
      std::string p = "envoy/";
      append_name_part(p, d.domain);
      return p;
    }();
    try {
      for (descriptor_config& child : d.descriptors) bld.add_child(dom->root, child, prefix);
    } catch (const error& e) {
      return e;
    }
    for (auto& p : bld.pending) {
      where.push_back(p.first->config.where);
      pending.push_back(std::move(p));
    }
    out->domains_.push_back(std::move(dom));
  }
  auto set = rule_set::build(b, rules, {.source = "envoy"}, previous ? previous->rules_.get() : nullptr);
  if (!set) {
    // Name the limit's file and line: the message names its rule.
    for (std::size_t i = 0; i < rules.size(); ++i) {
      if (set.error().message.find("'" + rules[i].name + "'") != std::string::npos)
        return error(errc::config_invalid, where[i] + ": " + set.error().message);
    }
    return error(errc::config_invalid, set.error().message);
  }
  out->rules_ = std::move(*set);
  // The set holds the rules in the order given: limit i's is rules()[i].
  for (std::size_t i = 0; i < pending.size(); ++i) pending[i].first->prepared = out->rules_->rules()[i].get();
  return std::shared_ptr<const rls_rules>(std::move(out));
}

const rls_domain* rls_rules::find(std::string_view domain) const noexcept {
  for (const auto& d : domains_) {
    if (d->name == domain) return d.get();
  }
  return nullptr;
}

const rls_node* rls_rules::match(const rls_domain& d, std::span<const entry> entries,
                                 std::vector<match_step>* steps) const {
  thread_local std::string lookup;
  if (steps != nullptr) steps->clear();
  const rls_node* level = &d.root;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    lookup.assign(entries[i].key);
    lookup += '_';
    lookup += entries[i].value;
    const rls_node* next = nullptr;
    matched_by by = matched_by::value;
    if (auto it = level->children.find(lookup); it != level->children.end()) next = it->second.get();
    if (next == nullptr) {
      for (const auto& [parts, node] : level->wildcards) {
        if (wildcard_match(parts, lookup)) {
          next = node;
          by = matched_by::wildcard;
          break;
        }
      }
    }
    if (next == nullptr) {
      if (auto it = level->children.find(entries[i].key); it != level->children.end()) {
        next = it->second.get();
        by = matched_by::key;
      }
    }
    if (next == nullptr) return nullptr;
    if (steps != nullptr) steps->push_back({next, by});
    if (i + 1 == entries.size()) return next->limits.empty() ? nullptr : next;
    if (next->children.empty()) return nullptr;
    level = next;
  }
  return nullptr;
}

}  // namespace sluice::envoy
