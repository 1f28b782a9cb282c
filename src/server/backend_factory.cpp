// SPDX-License-Identifier: Apache-2.0
// Turns [backend] settings into a backend (sluice/server/backend_factory.hpp).
#include "server/backend_factory.hpp"

#include "server/redis_factory.hpp"
#include "sluice/memory_backend.hpp"

namespace sluice::server {

result<void> check_servable(const config& cfg) {
  switch (cfg.backend.type) {
    case backend_type::memory: return {};
    case backend_type::redis:
    case backend_type::redis_cluster:
    case backend_type::redis_sentinel: return check_servable_on_redis(cfg);
  }
  return {errc::config_invalid, "unknown backend type"};
}

result<std::string> check_config_file(const std::string& path) {
  auto cfg = load_config(path);
  if (!cfg) return cfg.error();
  if (auto s = check_servable(*cfg); !s) return s.error();
  return path + ": ok (" + std::to_string(cfg->rules.size()) + " rules, " + std::to_string(cfg->overrides.size()) +
         " overrides, backend " + std::string(to_string(cfg->backend.type)) +
         (cfg->enabled ? "" : ", limiting disabled") + ")";
}

result<std::unique_ptr<backend>> make_backend(const backend_settings& s,
                                              std::span<boost::asio::io_context* const> io_threads) {
  if (s.type != backend_type::memory) return make_redis_backend_from(s, io_threads);
  // Windows aligned to the Unix epoch, as on Redis: a fixed window of a minute starts at :00.
  auto b = make_memory_backend({.clock = &unix_epoch_clock(), .max_keys_per_rule = s.max_keys_per_rule});
  if (!b) return error(errc::config_invalid, "[backend] " + b.error().message);
  return std::unique_ptr<backend>(std::move(*b));
}

}  // namespace sluice::server
