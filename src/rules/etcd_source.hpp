// SPDX-License-Identifier: Apache-2.0
// sluiced's etcd source of rules: a watch of the [etcd] prefix whose updates reach the service's
// control thread coalesced, so that a flood of puts costs one rebuild per pass, not one per put.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sluice/error.hpp"
#include "sluice/server/rule_source_status.hpp"
#include "sluice/server/config.hpp"
#include "rules/rule_sources.hpp"

namespace sluice::server {

class etcd_source {
 public:
  struct state {
    std::vector<etcd_value> values;  ///< every key under the prefix, in key order, those left out included
    rule_source_status status;       ///< name "etcd"
  };

  /// Starts watching. `changed` runs on the watcher's thread when the prefix or the connection
  /// changed, once until the next read(): it should post the read to the caller's thread. An
  /// unreachable etcd is not an error (the watch keeps trying); bad settings, or a build without
  /// etcd, are.
  static result<std::unique_ptr<etcd_source>> start(const etcd_settings& settings, std::function<void()> changed);

  virtual ~etcd_source() = default;

  /// The prefix's values and the watch's status now; arms `changed` again.
  virtual state read() = 0;
};

}  // namespace sluice::server
