// SPDX-License-Identifier: Apache-2.0
// src/envoy/rls_rules.hpp — an Envoy config's domains prepared on a backend: each limit a prepared
// rule (rule_set), each descriptor level a lookup table; matched as envoyproxy/ratelimit matches.
//
//   auto rules = rls_rules::build(load_domains(dir).value(), backend, previous.get(), counters);
//   const rls_node* n = (*rules)->match(*(*rules)->find("api"), entries);  // null: no limit
//
// A limit's rule is named after its place in the config ("envoy/api/path=/login*#1"), so that a
// reload keeps the state of every limit whose place is unchanged — and, when only its numbers
// changed, carries it over (a raised limit raises the remaining count at once).
//
// Thread-safe: immutable once built.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/composite_key.hpp"
#include "envoy/domain_config.hpp"
#include "sluice/backend.hpp"
#include "sluice/rule_set.hpp"

namespace sluice::envoy {

/// One descriptor's counters for /metrics, kept across reloads (a reload does not reset them).
struct descriptor_counters {
  std::atomic<std::uint64_t> hits{0};
  std::atomic<std::uint64_t> over_limit{0};
  std::atomic<std::uint64_t> within_limit{0};
  std::atomic<std::uint64_t> near_limit{0};
  std::atomic<std::uint64_t> shadow_mode{0};
};

/// Every descriptor's counters by (domain, descriptor path); `detailed` ones (detailed_metric: the
/// request's values in the path) at most `max_detailed` in all, later ones counted under their
/// descriptor's own path. Thread-safe.
class counter_registry {
 public:
  explicit counter_registry(std::size_t max_detailed) : max_detailed_(max_detailed) {}
  descriptor_counters& of(const std::string& domain, const std::string& path);
  descriptor_counters& detailed(const std::string& domain, const std::string& path, descriptor_counters& fallback);
  void append_metrics(std::string& prometheus_text) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, std::string>, std::unique_ptr<descriptor_counters>> counters_;  // guarded
  std::size_t detailed_count_ = 0;                                                                // guarded
  const std::size_t max_detailed_;
};

/// One limit of a descriptor.
struct rls_limit {
  rate_limit_config config;
  const prepared_rule* prepared = nullptr;  ///< Null for unlimited ones; owned by the rule set.
};

using name_hash = detail::string_hash;  // a request's key finds its node without a copy

/// A wildcard descriptor's "key_value" split at each '*': a request's "key_value" matches when it
/// holds the parts in order, starting with the first and ending with the last.
using wildcard_parts = std::vector<std::string>;

struct rls_node {
  std::vector<rls_limit> limits;
  bool shadow_mode = false;
  bool quota_mode = false;
  bool detailed_metric = false;
  bool share_threshold = false;
  bool value_to_metric = false;
  std::string value;  ///< As configured (a wildcard's pattern, for share_threshold).
  std::string path;   ///< "key_value.key2", as envoyproxy/ratelimit names its stats.
  descriptor_counters* counters = nullptr;
  /// "key_value" for a value (a wildcard's too, as written), "key" for a key alone.
  std::unordered_map<std::string, std::unique_ptr<rls_node>, name_hash, std::equal_to<>> children;
  /// The wildcard values' parts and their nodes, in config order.
  std::vector<std::pair<wildcard_parts, rls_node*>> wildcards;
};

/// How a request's entry found its node.
enum class matched_by : std::uint8_t { value, wildcard, key };

/// One level of a match: the node an entry found, and how.
struct match_step {
  const rls_node* node = nullptr;
  matched_by by = matched_by::value;
};

struct rls_domain {
  std::string name;
  rls_node root;
};

/// One descriptor entry of a request.
struct entry {
  std::string_view key;
  std::string_view value;
};

/// Whether `key_value` matches a wildcard's parts (each '*' any run of characters, none included).
bool wildcard_match(const wildcard_parts& parts, std::string_view key_value) noexcept;

/// Appends `s` to a rule name with '/', '=', '#' and '%' escaped, so that no key, value or domain
/// can make two places share a name.
void append_name_part(std::string& name, std::string_view s);

class rls_rules {
 public:
  /// Prepares every limit of `domains` on `b`, reusing `previous`'s prepared rules (may be null;
  /// built on the same backend). Errors: a limit the backend refuses (its file and line).
  static result<std::shared_ptr<const rls_rules>> build(std::vector<domain_config> domains, backend& b,
                                                        const rls_rules* previous, counter_registry& counters);

  const rls_domain* find(std::string_view domain) const noexcept;

  /// The node `entries` lead to with limits at their last entry, walking as envoyproxy/ratelimit
  /// does: at each level the exact key_value, else the first wildcard that matches it, else the
  /// key alone. Null when none applies. `steps` (may be null) gets each level's node and how it
  /// was found.
  const rls_node* match(const rls_domain& d, std::span<const entry> entries,
                        std::vector<match_step>* steps = nullptr) const;

  std::size_t domain_count() const noexcept { return domains_.size(); }
  std::size_t limit_count() const noexcept { return rules_->size(); }
  const rule_set& rules() const noexcept { return *rules_; }

 private:
  std::vector<std::unique_ptr<rls_domain>> domains_;
  std::shared_ptr<const rule_set> rules_;
};

}  // namespace sluice::envoy
