// SPDX-License-Identifier: Apache-2.0
// sluice/rule_set.hpp — every rule of a configuration, prepared on one backend, swapped as a whole.
//
// A rule_set is an immutable snapshot: the prepared form of each rule (backend::prepare), where the
// rules came from and a version. A new set is built from a previous one: a rule whose definition
// did not change keeps its prepared form — and with it its limiter state —, a rule whose limits
// alone changed keeps its keys' state under the new limits (backend::prepare_change), and any
// other starts afresh. Whoever publishes rules (a config file's reload, and next a config centre's watch)
// builds a set and swaps one shared pointer; checks already running keep the set they started with.
//
//   auto set = sluice::rule_set::build(*backend, cfg.rules, {.source = "sluice.toml"}, previous.get());
//   if (!set) return log(set.error().message);           // "rule 'api': burst must be >= 0, got -1"
//   const sluice::prepared_rule* api = (*set)->find("api");
//   backend->check({.rule = api, .key = "user:42"});
//
// Thread-safe: immutable once built.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "sluice/backend.hpp"
#include "sluice/error.hpp"
#include "sluice/policy.hpp"

namespace sluice {

class rule_set {
 public:
  struct origin {
    std::string source;  ///< Where the rules came from ("sluice.toml", "etcd"), for logs.
  };

  /// Prepares `rules` (names unique) on `b`, reusing from `previous` (may be null; built on the same
  /// backend) every rule whose definition is unchanged, and carrying over the state of those whose
  /// limits alone changed. The version is previous's + 1, or 1.
  /// Errors: a rule the backend refuses (its name in the message), a name used twice.
  static result<std::shared_ptr<const rule_set>> build(backend& b, const std::vector<rule>& rules, origin from,
                                                       const rule_set* previous);

  /// The rules, in the order given to build().
  const std::vector<prepared_rule_ptr>& rules() const noexcept { return rules_; }
  /// The rule named `name`, or nullptr. One hash lookup.
  const prepared_rule* find(std::string_view name) const noexcept;
  /// Where the rule named `name` is in rules(), or npos. One hash lookup.
  std::size_t position(std::string_view name) const noexcept;
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);
  std::size_t size() const noexcept { return rules_.size(); }
  std::uint64_t version() const noexcept { return version_; }
  const std::string& source() const noexcept { return from_.source; }
  /// Rules carried over from the previous set unchanged (their state kept).
  std::size_t kept() const noexcept { return kept_; }

 private:
  rule_set() = default;

  void add(prepared_rule_ptr p);
  const prepared_rule_ptr* entry(std::string_view name) const noexcept;

  std::vector<prepared_rule_ptr> rules_;
  std::unordered_map<std::string_view, std::size_t> by_name_;  // index into rules_
  origin from_;
  std::uint64_t version_ = 1;
  std::size_t kept_ = 0;
};

}  // namespace sluice
