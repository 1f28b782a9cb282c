// SPDX-License-Identifier: Apache-2.0
// server/server.hpp — sluiced itself: the HTTP decision API over Boost.Beast, health and
// metrics endpoints, config reload on SIGHUP or file change, and draining on SIGTERM.
//
// Endpoints: POST /v1/check (single or {"checks": [...]}), GET /healthz, GET /readyz, GET /metrics.
// Every check goes through backend::async_check, so a Redis round trip never blocks an io thread.
//
//   sluice::server::server_options o{.config_path = "/etc/sluice/sluice.toml"};
//   return sluice::server::run(o);   // until SIGTERM or SIGINT; returns the exit code
//
// Thread-safe: run() is called once per process; it owns its threads.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace sluice::server {

struct server_options {
  /// The TOML file to load and watch. Required.
  std::string config_path;
  /// Overrides [server] listen ("host:port"). Default: none.
  std::optional<std::string> listen;
  /// Told each change of state, in sd_notify's words: "READY=1" once serving, "RELOADING=1" then
  /// "READY=1" around a reload, "STOPPING=1" when draining. sluiced passes systemd's sd_notify
  /// (Type=notify); the library itself does not depend on systemd. Default: none.
  std::function<void(std::string_view state)> notify;
};

/// Loads the config, listens, serves until SIGTERM/SIGINT, drains in-flight requests and returns
/// 0; returns 1 when the config cannot be loaded or the address cannot be bound.
int run(const server_options& options);

}  // namespace sluice::server
