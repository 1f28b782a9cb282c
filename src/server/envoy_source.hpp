// SPDX-License-Identifier: Apache-2.0
// sluiced's Envoy API: the gRPC server of envoy.service.ratelimit.v3 on [server] grpc_listen, its
// limits from [envoy] config_dir, reloaded when the directory's files change (or on SIGHUP); an
// invalid file keeps the running limits.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "sluice/backend.hpp"
#include "sluice/error.hpp"
#include "sluice/server/config.hpp"

namespace sluice::server {

class envoy_source {
 public:
  /// Loads the directory, prepares its limits on `b` and listens. Errors: an invalid file, an
  /// address that cannot be bound, a build without the Envoy component.
  static result<std::unique_ptr<envoy_source>> start(const envoy_settings& settings, const std::string& grpc_listen,
                                                     const envoy::grpc_limits& limits, backend& b);
  virtual ~envoy_source() = default;

  /// Called every watch interval on the control thread: reloads once the directory's files have
  /// changed and then stayed the same for one interval (an editor's half-written file is not read).
  virtual void poll() = 0;
  virtual void reload(std::string_view trigger) = 0;
  virtual void append_metrics(std::string& prometheus_text) = 0;
  /// Stops taking calls; those running get `grace` to finish, on a thread of its own (the HTTP
  /// drain goes on meanwhile).
  virtual void begin_shutdown(std::chrono::milliseconds grace) = 0;
  /// Ends the server (at once if begin_shutdown was not called) and waits for it.
  virtual void shutdown() = 0;
};

}  // namespace sluice::server
