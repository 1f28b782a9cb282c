// The rules sluiced serves at one moment: a loaded config and its rules prepared on the backend.
// Built at start and at each reload, then shared read-only by every io thread.
#pragma once

#include <memory>

#include "sluice/backend.hpp"
#include "sluice/error.hpp"
#include "sluice/http/headers.hpp"
#include "sluice/rule_set.hpp"
#include "sluice/server/api.hpp"
#include "sluice/server/config.hpp"

namespace sluice::server {

// One loaded configuration and what is derived from it: its rules prepared on the backend, in the
// config's order (rules->rules()[i] is cfg.rules[i]), so a check finds its prepared rule by index.
struct snapshot {
  config cfg;  // cfg.rules: the rules in force, the file's and etcd's merged
  std::vector<rule_origin> origins;  // where each of cfg.rules came from
  std::shared_ptr<const rule_set> rules;
  sluice::http::header_options headers;

  const prepared_rule& prepared(const rule& r) const { return *rules->rules()[static_cast<std::size_t>(&r - cfg.rules.data())]; }
};

// `origins`: index-aligned with cfg.rules; empty means all from the file. `previous` (may be null):
// its unchanged rules keep their prepared form, hence their state.
result<std::shared_ptr<const snapshot>> make_snapshot(config cfg, std::vector<rule_origin> origins, backend& b,
                                                      const snapshot* previous);

}  // namespace sluice::server
