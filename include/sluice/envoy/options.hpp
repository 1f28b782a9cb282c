// SPDX-License-Identifier: Apache-2.0
// sluice/envoy/options.hpp — how sluiced answers Envoy's ShouldRateLimit (envoy.service.ratelimit.v3).
//
//   sluice::envoy::rls_options o{.all_or_nothing = true, .response_headers = true};
//
// Thread-safe: a value.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace sluice::envoy {

struct rls_options {
  /// A request passes only if all its descriptors do, and a refused one consumes nothing (on a
  /// Redis Cluster, but for a race between two rounds: see backend::check_all). False counts
  /// each descriptor on its own, as envoyproxy/ratelimit does, except that a descriptor over its
  /// limit adds nothing to its own counter (the reference's does, past the limit). Default: true.
  bool all_or_nothing = true;
  /// Every descriptor in shadow mode: an OVER_LIMIT request is answered OK (its descriptors'
  /// statuses still say OVER_LIMIT), as the reference's SHADOW_MODE. Default: false.
  bool shadow_mode = false;
  /// Every descriptor in quota mode: a request is refused only when all its limited descriptors
  /// are over their limits, as the reference's QUOTA_MODE. Default: false.
  bool quota_mode = false;
  /// The share of a limit past which units count as near_limit in /metrics, as the reference's
  /// NEAR_LIMIT_RATIO. Default: 0.8.
  double near_limit_ratio = 0.8;
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

/// What one gRPC peer may hold of the server ([server] grpc_*). Zero durations turn that limit off.
struct grpc_limits {
  /// Most open connections (`grpc_max_connections`); at the cap a new one first closes the
  /// connection idle longest. Default: 1,000.
  std::size_t max_connections = 1000;
  /// Calls open at once on one connection, advertised as SETTINGS_MAX_CONCURRENT_STREAMS
  /// (`grpc_max_concurrent_streams`); one more is refused (REFUSED_STREAM). Default: 100.
  std::uint32_t max_concurrent_streams = 100;
  /// A connection with no call open this long is closed (`grpc_idle_timeout_ms`). Default: 5 min.
  std::chrono::milliseconds idle_timeout{300'000};
  /// A connection this old is told GOAWAY (`grpc_max_connection_age_ms`), and closed once its
  /// calls end or `max_connection_age_grace` later (`grpc_max_connection_age_grace_ms`).
  /// Defaults: 0 (no age limit), 10 s.
  std::chrono::milliseconds max_connection_age{0};
  std::chrono::milliseconds max_connection_age_grace{10'000};
  /// Answers (or bytes) waiting this long for a peer that does not read them close its
  /// connection (`grpc_write_timeout_ms`). Default: 30 s.
  std::chrono::milliseconds write_timeout{30'000};
  /// A call whose request has not fully arrived this long after its headers is answered
  /// DEADLINE_EXCEEDED (`grpc_request_timeout_ms`). Default: 10 s.
  std::chrono::milliseconds request_timeout{10'000};
  /// The largest request message; larger ones are answered RESOURCE_EXHAUSTED. Default: 64 KiB.
  std::size_t max_message_bytes = 64 << 10;
  /// Request bytes all connections may hold at once before their calls are answered
  /// RESOURCE_EXHAUSTED. Default: 256 MiB.
  std::size_t max_buffered_bytes = std::size_t{256} << 20;
  /// Stream resets a peer may cause, as a burst and then per second, before its connection is
  /// closed (rapid reset). Defaults: 1,000 and 100/s.
  std::uint64_t reset_burst = 1000;
  std::uint64_t resets_per_second = 100;
  bool operator==(const grpc_limits&) const = default;
};

}  // namespace sluice::envoy
