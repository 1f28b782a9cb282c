// SPDX-License-Identifier: Apache-2.0
// sluice/server/config.hpp — sluiced's configuration: rules, server, backend and HTTP settings from TOML.
//
// Two forms are accepted, alone or together in one file. The short form defines the rule `default`:
//
//   [ratelimit]
//   enabled = true
//   algorithm = "sliding_window"   # token_bucket | sliding_window | sliding_window_counter | fixed_window
//   token_rate = 10                # token bucket: tokens per second
//   token_burst = 20               # token bucket: bucket size
//   window = 60                    # windows: seconds, or "250ms", "60s", "5m", "1h", "1d"
//   limit = 100                    # windows: admissions per window
//
// The full form has [server], [backend], [http] and any number of [[rules]] (see examples/sluice.toml).
// Any unknown key, wrong type, missing field or impossible value is an error whose message starts
// with "file:line:column: ".
//
//   sluice::result<sluice::config> c = sluice::load_config("/etc/sluice/sluice.toml");
//   if (!c) { std::cerr << c.error().message << '\n'; return 2; }
//   for (const sluice::rule& r : c->rules) ...
//
// Thread-safe: free functions over values.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/backend.hpp"
#include "sluice/duration.hpp"
#include "sluice/envoy/options.hpp"
#include "sluice/error.hpp"
#include "sluice/etcd/options.hpp"
#include "sluice/policy.hpp"
#include "sluice/redis_options.hpp"

namespace sluice::server {

/// Where limiter state lives.
enum class backend_type : std::uint8_t { memory, redis, redis_cluster, redis_sentinel };

std::string_view to_string(backend_type t) noexcept;

/// [server]
struct server_settings {
  /// "host:port" (IPv6 as "[::1]:8080") to listen on. Default: "127.0.0.1:8080".
  std::string listen = "127.0.0.1:8080";
  /// I/O threads; 0 means one per core. Default: 0. On Redis each has its own connections.
  unsigned threads = 0;
  /// Log every refusal as `rate_limited=true rule=... user=...`. Default: false.
  /// Also accepted as `log_rejections` in [ratelimit].
  bool log_rejections = false;
  /// The bearer token POST /v1/reset asks for (`Authorization: Bearer <token>`), 16 to 256
  /// printable characters; "" (the default) turns resets off (403).
  std::string admin_token;
  /// How often the config file's modification time is checked for a reload; 0 disables the
  /// watch (SIGHUP still reloads). Default: 1 s.
  std::chrono::milliseconds watch_interval{1000};
  /// How long SIGTERM waits for in-flight requests before exiting anyway. Default: 10 s.
  std::chrono::milliseconds drain_timeout{10'000};
  /// At most this many distinct tenant label values in /metrics; later tenants count as "other".
  /// Default: 100.
  std::size_t max_tenant_labels = 100;
  /// Most open client connections (`max_connections`), lowered at start to the descriptor limit
  /// less 64. At the cap a new connection first closes the one that has waited longest for a
  /// request. Default: 10,000.
  std::size_t max_connections = 10'000;
  /// How often idle limiter state is dropped (`sweep_interval_ms`), so memory comes back after a
  /// key flood; 0 leaves it to the tables' own growth. Default: 10 s.
  std::chrono::milliseconds sweep_interval{10'000};
  /// "host:port" for Envoy's rate-limit API over gRPC (`grpc_listen`, see [envoy]); "" serves
  /// none. Default: "".
  std::string grpc_listen;
  /// What one gRPC peer may hold (`grpc_max_connections`, `grpc_max_concurrent_streams`,
  /// `grpc_idle_timeout_ms`, `grpc_max_connection_age_ms`, `grpc_max_connection_age_grace_ms`,
  /// `grpc_write_timeout_ms`, `grpc_request_timeout_ms`, `grpc_max_message_bytes`,
  /// `grpc_reset_burst`, `grpc_resets_per_second`): sluice/envoy/options.hpp.
  envoy::grpc_limits grpc;
};

/// [backend]
struct backend_settings {
  /// memory | redis | redis_cluster | redis_sentinel. Default: memory.
  backend_type type = backend_type::memory;
  /// type = "redis": every option of the Redis backend, read from the same table under the names
  /// of its fields — `addresses`, `username`, `password`, `database`, `key_prefix`, `on_error`,
  /// `max_pending`, `breaker_failure_threshold` — durations in ms: `timeout_ms` (command_timeout),
  /// `connect_timeout_ms`, `breaker_probe_interval_ms`, `error_log_interval_ms` — and TLS: `tls`,
  /// `tls_ca_file`, `tls_ca_dir`, `tls_cert_file`, `tls_key_file`, `tls_server_name`, `tls_verify`.
  /// type = "redis_sentinel": `sentinels` (read into addresses, which is then not allowed),
  /// `master_name`, `sentinel_username`, `sentinel_password`. Defaults: redis_options's
  /// (redis_options.hpp).
  redis_options redis;
  /// Memory backend: hard cap on live keys per rule. Default: 1,000,000.
  std::size_t max_keys_per_rule = 1'000'000;

  bool operator==(const backend_settings&) const = default;
};

/// [http]
struct http_settings {
  /// Send X-RateLimit-Limit/Remaining/Reset (`legacy_headers`). Default: true.
  bool legacy_headers = true;
  /// Send the IETF draft's RateLimit-Policy and RateLimit fields (`ietf_headers`). Default: false.
  bool ietf_headers = false;
};

/// [log]: sluiced's log lines, to stderr (journald under systemd).
struct log_settings {
  /// "text": one line per event, `event=...` then key=value fields; "json": one JSON object per
  /// line, with `time`, `level` and the same fields (`format`). Default: "text".
  std::string format = "text";
  /// The lowest level written: trace, debug, info, warn, error, critical or off (`level`).
  /// Default: "info".
  std::string level = "info";
  bool operator==(const log_settings&) const = default;
};

/// [etcd]: a second source of rules, watched at run time. Rules under `prefix + "rules/NAME"` (JSON
/// objects with the fields of a [[rules]] table) override the file's rule of the same name;
/// overrides live under `prefix + "overrides/ID"`.
struct etcd_settings {
  /// True when the file has an [etcd] section.
  bool enabled = false;
  /// The watch's options (sluice/etcd/options.hpp), every one settable here: `endpoints` (required),
  /// `prefix` ("/sluice/"), `username`/`password`, TLS `ca_file`/`cert_file`/`key_file`,
  /// `dial_timeout_ms` (default 2000 here), `request_timeout_ms`, `backoff_base_ms`, `backoff_cap_ms`.
  etcd::etcd_options options{.endpoints = {}, .dial_timeout = std::chrono::milliseconds(2000)};

  bool operator==(const etcd_settings&) const = default;
};

/// [envoy]: Envoy's external rate-limit API (envoy.service.ratelimit.v3) on [server] grpc_listen,
/// its limits from envoyproxy/ratelimit's YAML files. Read at start (a change needs a restart);
/// the directory's files are reloaded when they change.
struct envoy_settings {
  /// True when the file has an [envoy] section.
  bool enabled = false;
  /// The directory of *.yaml/*.yml files, one domain each (`config_dir`, required); relative to
  /// the config file's directory.
  std::string config_dir;
  /// Files of one domain merge their descriptors (`merge_domains`, the reference's
  /// MERGE_DOMAIN_CONFIG); otherwise a domain in two files is an error. Default: false.
  bool merge_domains = false;
  /// Every option of the Envoy API, read under the names of its fields: `all_or_nothing`,
  /// `shadow_mode`, `quota_mode`, `near_limit_ratio`, `response_headers`, `header_limit`,
  /// `header_remaining`, `header_reset`, `max_detailed_labels` (sluice/envoy/options.hpp).
  envoy::rls_options options;
  bool operator==(const envoy_settings&) const = default;
};

/// One key's own limits for a rule — or one tenant's, or one tenant's user's, for a dual-layer
/// rule: `[[overrides]]` in the file, `PREFIX overrides/ID` in etcd. It replaces the limit
/// parameters of that key and nothing else; the fields it may set follow the rule's algorithm.
struct rule_override {
  std::string rule;                          ///< The rule's name. Required.
  std::string key;                           ///< Single-layer rules: the key.
  std::string tenant;                        ///< Dual-layer rules: the tenant...
  std::string user;                          ///< ...and optionally one of its users.
  std::optional<double> rate;                ///< token_bucket
  std::optional<std::int64_t> burst;         ///< token_bucket
  std::optional<std::int64_t> limit;         ///< single-layer windows
  std::optional<std::int64_t> tenant_limit;  ///< dual-layer, tenant overrides only
  std::optional<std::int64_t> user_limit;    ///< dual-layer
  std::string source;  ///< For messages: "file.toml [[overrides]] #2", "etcd /sluice/overrides/x (mod_revision 9)".

  /// Whom it concerns, as one string (the rule's name first): overrides of one target replace
  /// each other.
  std::string target() const;
  friend bool operator==(const rule_override&, const rule_override&) = default;
};

/// Most overrides in force (file and etcd together); more are refused at load.
inline constexpr std::size_t max_overrides = 10'000;

/// Most [[rules]] a config file defines (etcd adds at most as many again); more are refused at load.
inline constexpr std::size_t max_file_rules = 1024;

/// `base` with `o`'s parameters: errors name what does not fit (a field its algorithm does not
/// have, a key for a dual-layer rule, a limit out of range). `base` must be o.rule.
result<rule> apply_override(const rule& base, const rule_override& o);

/// A whole configuration file.
struct config {
  /// The file it was read from (for messages); "" when parsed from a string without a name.
  std::string source;
  /// `[ratelimit] enabled`; false admits every check without touching the backend. Default: true.
  bool enabled = true;
  server_settings server;
  backend_settings backend;
  http_settings http;
  log_settings log;
  etcd_settings etcd;
  envoy_settings envoy;
  /// Every rule, `default` first when the [ratelimit] form defines it. Names are unique.
  std::vector<rule> rules;
  /// [[overrides]], each checked against its rule; targets are unique.
  std::vector<rule_override> overrides;
};

/// The longest rule name accepted.
inline constexpr std::size_t max_rule_name_length = 64;

/// Parses TOML text; `source_name` prefixes every error message ("name:line:column: ...").
result<config> parse_config(std::string_view toml_text, std::string_view source_name);

/// Reads one rule from a JSON object with the fields of a [[rules]] table, its name given apart (an
/// etcd key's last part; a "name" field, if any, must match). Errors start with `source`.
result<rule> parse_rule_json(std::string_view name, std::string_view json_text, std::string_view source);

/// Reads one override from a JSON object with the fields of an [[overrides]] table. Its rule is
/// not looked up (see apply_override). Errors start with `source`.
result<rule_override> parse_override_json(std::string_view json_text, std::string_view source);

/// Reads and parses a file. A missing or unreadable file is an error naming it.
result<config> load_config(const std::string& path);

}  // namespace sluice::server
