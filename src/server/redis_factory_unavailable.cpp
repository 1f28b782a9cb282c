// SPDX-License-Identifier: Apache-2.0
// sluiced's Redis backends (redis_factory.hpp) in a build without the Redis component
// (SLUICE_WITH_REDIS=OFF).
#include "server/redis_factory.hpp"

#include <string>

namespace sluice::server {

result<void> check_servable_on_redis(const config& cfg) {
  return {errc::config_invalid, cfg.source + ": [backend] type = \"" + std::string(to_string(cfg.backend.type)) +
                                    "\": this sluiced was built without Redis support (SLUICE_WITH_REDIS=OFF)"};
}

result<std::unique_ptr<backend>> make_redis_backend_from(const backend_settings& s,
                                                         std::span<boost::asio::io_context* const>) {
  return error(errc::config_invalid, "[backend] type = \"" + std::string(to_string(s.type)) +
                                         "\": this sluiced was built without Redis support (SLUICE_WITH_REDIS=OFF)");
}

}  // namespace sluice::server
