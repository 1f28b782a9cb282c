// Turns [backend] settings into a backend. Redis support is compiled in when sluice_redis exists.
#include "sluice/memory_backend.hpp"
#include "sluice/server/server.hpp"

#ifdef SLUICE_HAVE_REDIS
#include "sluice/redis_backend.hpp"
#endif

namespace sluice::server {

result<void> check_servable(const config& cfg) {
  switch (cfg.backend.type) {
    case backend_type::memory: return {};
    case backend_type::redis:
    case backend_type::redis_cluster:
#ifdef SLUICE_HAVE_REDIS
      for (const rule& r : cfg.rules) {
        if (auto v = validate_for_redis(r); !v) return {errc::config_invalid, cfg.source + ": " + v.error().message};
      }
      return {};
#else
      return {errc::config_invalid, cfg.source + ": [backend] type = \"" + std::string(to_string(cfg.backend.type)) +
                                        "\": this sluiced was built without Redis support"};
#endif
  }
  return {errc::config_invalid, "unknown backend type"};
}

result<std::unique_ptr<backend>> make_backend(const backend_settings& s) {
  if (s.type == backend_type::memory) {
    // Windows aligned to the Unix epoch, as on Redis: a fixed window of a minute starts at :00.
    auto b = make_memory_backend({.clock = &unix_epoch_clock(), .max_keys_per_rule = s.max_keys_per_rule});
    if (!b) return error(errc::config_invalid, "[backend] " + b.error().message);
    return std::unique_ptr<backend>(std::move(*b));
  }
#ifdef SLUICE_HAVE_REDIS
  auto b = s.type == backend_type::redis ? make_redis_backend(s.redis) : make_redis_cluster_backend(s.redis);
  if (!b) return error(errc::config_invalid, "[backend] " + b.error().message);
  return std::unique_ptr<backend>(std::move(*b));
#else
  return error(errc::config_invalid, "[backend] type = \"" + std::string(to_string(s.type)) +
                                         "\": this sluiced was built without Redis support");
#endif
}

}  // namespace sluice::server
