// SPDX-License-Identifier: Apache-2.0
// sluiced's Redis backends (redis_factory.hpp), in a build with the Redis component.
#include "server/redis_factory.hpp"

#include "sluice/redis_backend.hpp"

namespace sluice::server {

result<void> check_servable_on_redis(const config& cfg) {
  for (const rule& r : cfg.rules) {
    if (auto v = validate_for_redis(r); !v) return {errc::config_invalid, cfg.source + ": " + v.error().message};
  }
  return {};
}

result<std::unique_ptr<backend>> make_redis_backend_from(const backend_settings& s,
                                                         std::span<boost::asio::io_context* const> io_threads) {
  auto b = s.type == backend_type::redis_cluster    ? make_redis_cluster_backend(s.redis, io_threads)
           : s.type == backend_type::redis_sentinel ? make_redis_sentinel_backend(s.redis, io_threads)
                                                    : make_redis_backend(s.redis, io_threads);
  if (!b) return error(errc::config_invalid, "[backend] " + b.error().message);
  return std::unique_ptr<backend>(std::move(*b));
}

}  // namespace sluice::server
