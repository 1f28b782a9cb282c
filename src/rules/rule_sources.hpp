// SPDX-License-Identifier: Apache-2.0
// Where sluiced's rules come from: its config file, and optionally etcd. The rules in force are the
// file's, each overridden by an etcd rule of the same name, then the rules only etcd has.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/error.hpp"
#include "sluice/policy.hpp"
#include "sluice/server/rule_source_status.hpp"
#include "sluice/server/config.hpp"

namespace sluice::server {

/// One key under the watched prefix, as etcd holds it.
struct etcd_value {
  std::string key;  ///< without the prefix: "rules/api"
  std::string value;
  std::int64_t mod_revision = 0;
  /// Why the watcher left this version's value out (over a bound); empty when it holds it. A
  /// version left out is rejected like one that does not parse.
  std::string left_out;
};

/// The rules etcd holds under `prefix + "rules/"` and the overrides under `prefix + "overrides/"`:
/// for each key, the last version that parsed and validated. A value that does not keeps the
/// previous version in force. Not thread-safe.
class etcd_rules {
 public:
  /// Most rules taken from etcd; keys beyond it are rejected.
  static constexpr std::size_t max_rules = 1024;

  struct entry {
    rule definition;
    std::string key;
    std::int64_t mod_revision = 0;
  };

  /// `check` is asked about every rule before it is taken (backend::validate_rule, which makes
  /// nothing): a rule it refuses is rejected like one that does not parse.
  etcd_rules(std::string prefix, std::function<result<void>(const rule&)> check);

  /// Takes etcd's whole view of the prefix. Returns the values rejected by this call: each bad
  /// version is reported once, however often the prefix changes around it. `changed` tells whether
  /// the rules differ from before.
  std::vector<rejected_value> apply(const std::vector<etcd_value>& values, bool& changed);

  struct override_entry {
    rule_override value;
    std::int64_t mod_revision = 0;
  };

  /// By rule name.
  const std::map<std::string, entry, std::less<>>& rules() const noexcept { return rules_; }
  /// By override id (the key's last part).
  const std::map<std::string, override_entry, std::less<>>& overrides() const noexcept { return overrides_; }

 private:
  std::string prefix_;
  std::function<result<void>(const rule&)> check_;
  std::map<std::string, entry, std::less<>> rules_;
  std::map<std::string, override_entry, std::less<>> overrides_;
  std::map<std::string, std::int64_t, std::less<>> reported_;  // key → the bad mod_revision already reported
};

/// The file's overrides, each replaced by etcd's override of the same target, then etcd's others
/// by id. Whether each fits its rule is checked as the snapshot is made.
std::vector<rule_override> merge_overrides(const std::vector<rule_override>& file_overrides, const etcd_rules* etcd);

/// The rules in force and where each came from (index-aligned).
struct merged_rules {
  std::vector<rule> rules;
  std::vector<rule_origin> origins;
};

/// The file's rules in their order, each replaced by etcd's rule of the same name, then etcd's
/// other rules by name.
merged_rules merge_rules(const std::vector<rule>& file_rules, const etcd_rules* etcd);

/// One reading of etcd's prefix (`values`, the watch's status `now`) taken by `rules`: the one way
/// sluiced and etcd_rule_source follow etcd. Each rejected version is logged once
/// (event=config_rejected) and counted in `errors`; the watch going up or down since `before` is
/// logged (event=config_source_up / config_source_down). Returns whether the rules or overrides
/// changed.
bool follow_etcd(etcd_rules& rules, const std::vector<etcd_value>& values, const rule_source_status& now,
                 const rule_source_status& before, std::atomic<std::uint64_t>& errors);

}  // namespace sluice::server
