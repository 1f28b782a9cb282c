// sluice/envoy/options.hpp — how sluiced answers Envoy's ShouldRateLimit (envoy.service.ratelimit.v3).
//
//   sluice::envoy::rls_options o{.all_or_nothing = true, .response_headers = true};
//
// Thread-safe: a value.
#pragma once

#include <cstddef>
#include <string>

namespace sluice::envoy {

struct rls_options {
  /// A request passes only if all its descriptors do, and a refused one consumes nothing (on a
  /// Redis Cluster, but for a race between two rounds: see backend::check_all). False counts
  /// each descriptor on its own, as envoyproxy/ratelimit does, except that a descriptor over its
  /// limit adds nothing to its own counter (the reference's does, past the limit). Default: true.
  bool all_or_nothing = true;
  /// Add header_limit, header_remaining and header_reset to Envoy's response, from the descriptor
  /// closest to its limit. Default: false.
  bool response_headers = false;
  std::string header_limit = "RateLimit-Limit";
  std::string header_remaining = "RateLimit-Remaining";
  std::string header_reset = "RateLimit-Reset";
  /// At most this many detailed_metric label values in /metrics; later ones count under their
  /// descriptor's own label. Default: 100.
  std::size_t max_detailed_labels = 100;
  bool operator==(const rls_options&) const = default;
};

}  // namespace sluice::envoy
