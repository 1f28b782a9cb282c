#include "server/snapshot.hpp"

namespace sluice::server {

result<std::shared_ptr<const snapshot>> make_snapshot(config cfg, std::vector<rule_origin> origins, backend& b,
                                                      const snapshot* previous) {
  if (origins.empty()) origins.assign(cfg.rules.size(), rule_origin{.source = "file"});
  auto rules = rule_set::build(b, cfg.rules, {.source = cfg.source}, previous ? previous->rules.get() : nullptr);
  if (!rules) return rules.error();
  auto s = std::make_shared<snapshot>();
  s->headers = {.legacy_fields = cfg.http.legacy_headers, .ietf_fields = cfg.http.ietf_headers};
  s->cfg = std::move(cfg);
  s->origins = std::move(origins);
  s->rules = std::move(*rules);
  return std::shared_ptr<const snapshot>(std::move(s));
}

}  // namespace sluice::server
