// SPDX-License-Identifier: Apache-2.0
// server/backend_factory.hpp — the backend a sluiced config's [backend] describes.
//
//   auto cfg = sluice::server::load_config("/etc/sluice/sluice.toml");
//   if (auto ok = sluice::server::check_servable(*cfg); !ok) return fail(ok.error().message);
//   std::unique_ptr<sluice::backend> b = sluice::server::make_backend(cfg->backend, io_threads).value();
#pragma once

#include <memory>
#include <span>

#include <boost/asio/io_context.hpp>

#include "sluice/backend.hpp"
#include "sluice/error.hpp"
#include "sluice/server/config.hpp"

namespace sluice::server {

/// The backend `settings` describe: memory, redis, redis_cluster or redis_sentinel (the Redis ones when sluiced is
/// built with the Redis component; otherwise an error that says so). A Redis backend has its
/// connections on each of `io_threads` (at least one), which the caller runs.
result<std::unique_ptr<backend>> make_backend(const backend_settings& settings,
                                              std::span<boost::asio::io_context* const> io_threads);

/// Checks that `cfg` can be served by this build: its backend type is built in, and on Redis every
/// rule can be computed exactly. Parsing errors are already reported by load_config.
result<void> check_servable(const config& cfg);

/// `sluiced --check-config` and `sluice config check`: the file at `path` loaded and checked
/// servable, and the one line both print when it is ("PATH: ok (6 rules, 2 overrides, backend
/// memory)"), or the error, whole.
result<std::string> check_config_file(const std::string& path);

}  // namespace sluice::server
