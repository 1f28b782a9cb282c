// SPDX-License-Identifier: Apache-2.0
// The rules sluiced serves at one moment: a loaded config, its rules and overrides prepared on the
// backend. Built at start, at each reload and at each change from etcd, then shared read-only by
// every io thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/composite_key.hpp"
#include "sluice/backend.hpp"
#include "sluice/error.hpp"
#include "sluice/http/headers.hpp"
#include "sluice/rule_set.hpp"
#include "server/api.hpp"
#include "sluice/server/config.hpp"

namespace sluice::server {

// A check's key finds its override without a copy.
using override_map = std::unordered_map<std::string, prepared_rule_ptr, detail::string_hash, std::equal_to<>>;

// One loaded configuration and what is derived from it: its rules prepared on the backend, in the
// config's order (rules->rules()[i] is cfg.rules[i]), so a check finds its prepared rule by index.
struct snapshot {
  config cfg;  // cfg.rules: the rules in force, the file's and etcd's merged; cfg.overrides likewise
  std::vector<rule_origin> origins;  // where each of cfg.rules came from
  std::shared_ptr<const rule_set> rules;
  // Per rule (index-aligned with cfg.rules): its overrides by key — single-layer rules — or by
  // tenant and by detail::pair_key(tenant, user) — dual-layer rules. Empty for most rules.
  std::vector<override_map> overrides;
  std::size_t override_count = 0;
  sluice::http::header_options headers;

  // The prepared rule a check of `item` uses: its override's, or its rule's. One hash lookup when
  // the rule has overrides (two for a dual-layer rule), none otherwise.
  const prepared_rule& prepared_for(const check_item& item) const;
};

struct built_snapshot {
  std::shared_ptr<const snapshot> snap;
  std::vector<std::string> rejected_overrides;  // why each override left out was left out
};

// `origins`: index-aligned with cfg.rules; empty means all from the file. `previous` (may be null):
// its unchanged rules keep their prepared form, hence their state; those whose limits alone
// changed keep their keys' state (backend::prepare_change). Overrides are prepared over their
// rule's state (backend::prepare_override); a tenant's user's override starts from the tenant's.
// An override that does not fit its rule any more (its rule gone or of another algorithm) is left
// out and reported.
result<built_snapshot> make_snapshot(config cfg, std::vector<rule_origin> origins, backend& b,
                                     const snapshot* previous);

}  // namespace sluice::server
