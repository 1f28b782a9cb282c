// The Redis backends of sluiced: made from [backend] when sluiced is built with the Redis component
// (redis_factory.cpp), an error saying so otherwise (redis_factory_unavailable.cpp) — one source
// or the other is linked, as for etcd and Envoy.
#pragma once

#include <memory>

#include "sluice/backend.hpp"
#include "sluice/error.hpp"
#include "sluice/server/config.hpp"

namespace sluice::server {

/// Whether every rule of `cfg` can be computed exactly on Redis (validate_for_redis).
result<void> check_servable_on_redis(const config& cfg);

/// The redis, redis_cluster or redis_sentinel backend `s` describes.
result<std::unique_ptr<backend>> make_redis_backend_from(const backend_settings& s);

}  // namespace sluice::server
