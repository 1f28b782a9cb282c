// SPDX-License-Identifier: Apache-2.0
// sluice/server/etcd_rule_source.hpp — rules from etcd for a service that embeds sluice (a Beast or
// cpp-httplib service checking a backend itself), without sluiced.
//
// It watches PREFIX rules/NAME as sluiced does (JSON with the fields of a [[rules]] table): the
// `defaults` each overridden by etcd's rule of the same name, then the rules only etcd has. Each
// time they change it builds a rule_set on the backend from the previous one — unchanged rules keep
// their state, a rule whose limits alone changed keeps its keys' state —, publishes it (current())
// and passes it to `on_rules`, if given. A value that does not parse, or that the backend refuses,
// is rejected alone, logged once and the previous version kept (counted in errors()). Overrides
// (PREFIX overrides/ID) are sluiced's and are not part of a rule_set: here they count as rejected.
//
//   auto source = sluice::server::etcd_rule_source::start(
//       {.enabled = true, .options = {.endpoints = {"127.0.0.1:2379"}}}, *backend, default_rules, {});
//   std::shared_ptr<const sluice::rule_set> rules = (*source)->current();   // per request: no lock
//   backend->check({.rule = rules->find("api"), .key = "user:42"});
//
// Thread-safe: `on_rules` runs on the source's own thread, one call at a time, the first time
// before start() returns; current(), status() and errors() may be called from any thread. The
// backend must outlive the source.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "sluice/backend.hpp"
#include "sluice/error.hpp"
#include "sluice/policy.hpp"
#include "sluice/rule_set.hpp"
#include "sluice/server/rule_source_status.hpp"
#include "sluice/server/config.hpp"

namespace sluice::server {

class etcd_rule_source {
 public:
  using callback = std::function<void(std::shared_ptr<const rule_set>)>;

  /// Errors: invalid settings or defaults (a rule the backend refuses), a build without etcd. An
  /// unreachable etcd is not an error: the defaults are in force until it answers.
  static result<std::unique_ptr<etcd_rule_source>> start(const etcd_settings& settings, backend& b,
                                                         std::vector<rule> defaults, callback on_rules);
  ~etcd_rule_source();
  etcd_rule_source(const etcd_rule_source&) = delete;
  etcd_rule_source& operator=(const etcd_rule_source&) = delete;

  /// The rules in force now: one atomic load, and a lock only after a change (each thread keeps
  /// the set it read last, alive until it reads again).
  std::shared_ptr<const rule_set> current() const;
  /// The watch: connected, etcd's revision, the last connection error.
  rule_source_status status() const;
  /// Values rejected so far (each bad version once).
  std::uint64_t errors() const;

 private:
  struct impl;
  explicit etcd_rule_source(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace sluice::server
