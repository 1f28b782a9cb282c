// SPDX-License-Identifier: Apache-2.0
// sluice/server/rule_source_status.hpp — where rules in force come from, and what a source refused:
// what etcd_rule_source reports and sluiced's GET /v1/rules shows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sluice::server {

/// Where a rule in force came from.
struct rule_origin {
  std::string source;             ///< "file" or "etcd"
  std::string key;                ///< the etcd key; "" for the file
  std::int64_t mod_revision = 0;  ///< the etcd key's mod_revision; 0 for the file
};

/// A value that could not be used, with why.
struct rejected_value {
  std::string key;  ///< the full etcd key
  std::int64_t mod_revision = 0;
  std::string reason;
};

/// A source of rules as GET /v1/rules shows it.
struct rule_source_status {
  std::string name;           ///< "file" or "etcd"
  bool connected = true;      ///< etcd: the watch is live
  std::int64_t revision = 0;  ///< file: successful loads; etcd: the store revision last applied
  std::string detail;         ///< file: its path; etcd: while the watch is down, why
  /// etcd: the versions the watcher leaves out (over a bound), at most 100; the previous version
  /// of each stays in force.
  std::vector<rejected_value> rejected;
};

}  // namespace sluice::server
