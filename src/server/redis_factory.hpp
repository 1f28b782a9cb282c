// SPDX-License-Identifier: Apache-2.0
// The Redis backends of sluiced: made from [backend] when sluiced is built with the Redis component
// (redis_factory.cpp), an error saying so otherwise (redis_factory_unavailable.cpp) — one source
// or the other is linked, as for etcd and Envoy.
#pragma once

#include <memory>
#include <span>

#include <boost/asio/io_context.hpp>

#include "sluice/backend.hpp"
#include "sluice/error.hpp"
#include "sluice/server/config.hpp"

namespace sluice::server {

/// Whether every rule of `cfg` can be computed exactly on Redis (validate_for_redis).
result<void> check_servable_on_redis(const config& cfg);

/// The redis, redis_cluster or redis_sentinel backend `s` describes, with its connections on each of
/// `io_threads` (sluiced's workers): a check is decided on the thread that asked.
result<std::unique_ptr<backend>> make_redis_backend_from(const backend_settings& s,
                                                         std::span<boost::asio::io_context* const> io_threads);

}  // namespace sluice::server
