// SPDX-License-Identifier: Apache-2.0
// sluice/redis_options.hpp — the options of the Redis backend, apart from the backend itself.
//
// Standard library only (no Boost, no hiredis), so a configuration can hold them without depending
// on the Redis backend: sluiced's `backend_settings` (server/config.hpp) does. The backend is made
// from them by make_redis_backend (redis_backend.hpp), which validates them.
//
//   sluice::redis_options o{.addresses = {"10.0.0.5:6379"}, .on_error = sluice::failure_policy::local};
//   auto b = sluice::make_redis_backend(o);
//
// Thread-safe: a value.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "sluice/backend.hpp"
#include "sluice/clock.hpp"

namespace sluice {

struct redis_options {
  /// Servers as "host:port", "[v6addr]:port" or "unix:/path/to.sock". A single Redis uses the first;
  /// a Redis Cluster takes them all as seeds, any of which can tell the rest; with Sentinel they are
  /// the sentinels, asked in turn where the master is. Default: {"127.0.0.1:6379"}.
  std::vector<std::string> addresses{"127.0.0.1:6379"};
  /// ACL user name for AUTH; empty means the default user. Default: "".
  std::string username;
  /// Password for AUTH; empty means no AUTH. Default: "".
  std::string password;
  /// Redis Sentinel: the name of the master the sentinels watch (`sentinel monitor NAME ...`).
  /// Required by make_redis_sentinel_backend, unused by the others. Default: "".
  std::string master_name;
  /// Redis Sentinel: AUTH on the sentinels, which have users of their own (username and password
  /// are the master's). Empty password: no AUTH. Default: "".
  std::string sentinel_username;
  std::string sentinel_password;
  /// After each script call, WAIT until this many replicas have its writes (at most
  /// command_timeout); a check whose writes reached fewer follows `on_error`. Replication is
  /// asynchronous: without it, the admissions a master made just before a failover can be lost with
  /// it. Costs checks/s: the connection waits for each call's WAIT. 0..64. Default: 0 (no WAIT).
  int wait_replicas = 0;
  /// Database selected after connecting; 0 on a Redis Cluster. Default: 0.
  int database = 0;
  /// TLS to every server (one Redis, each Cluster node), TLS 1.2 or later; not on unix sockets.
  /// Default: false.
  bool tls = false;
  /// PEM file of the CAs that sign the servers' certificates. With tls_ca_dir empty too, the
  /// system's store. Default: "".
  std::string tls_ca_file;
  /// Folder of CA certificates (hashed names, as `openssl rehash` makes). Default: "".
  std::string tls_ca_dir;
  /// Client certificate (PEM, chain allowed) and its key, for servers that ask for one (mutual
  /// TLS). Both or neither. Default: "".
  std::string tls_cert_file;
  std::string tls_key_file;
  /// The name sent as SNI and that the server's certificate must carry. Default: "" (each address's
  /// host, name or IP address).
  std::string tls_server_name;
  /// Verify the server's certificate and name. false accepts any server (logged as a warning at
  /// start). Default: true.
  bool tls_verify = true;
  /// Longest a connection attempt may take. Default: 1000 ms.
  std::chrono::milliseconds connect_timeout{1000};
  /// Longest a check waits for Redis; then its decision follows `on_error`. Default: 50 ms.
  std::chrono::milliseconds command_timeout{50};
  /// Prepended to every key; must not contain `{` or `}`. Default: "sluice:".
  std::string key_prefix = "sluice:";
  /// What a check decides when Redis cannot answer (timeout, connection down, circuit open, error
  /// reply, too many pending): allow (admitted, source fail_open), deny (refused with retry_after
  /// 1 s, source fail_closed) or local (the same rule in an in-process memory backend of this
  /// instance, source local_fallback). Default: failure_policy::allow (fail open).
  failure_policy on_error = failure_policy::allow;
  /// Most checks waiting on Redis at once; beyond it a check fails at once (errc::backend_overloaded)
  /// and follows `on_error`. Default: 10,000.
  std::size_t max_pending = 10'000;
  /// Most checks sent as one script call. While a connection has calls in flight, the checks that
  /// arrive meanwhile go together in one call of the batch script, decided in order (each as it
  /// would be alone at the same instant); a check on an idle connection goes at once, alone. 1: never
  /// batch. Default: 64.
  std::size_t max_batch = 64;
  /// Consecutive failures (timeouts, lost connection) that open the circuit: checks then follow
  /// `on_error` at once instead of waiting for the timeout. Default: 5.
  int breaker_failure_threshold = 5;
  /// While the circuit is open, how often the backend tries to reconnect and PINGs Redis; the first
  /// answer closes the circuit. Default: 200 ms.
  std::chrono::milliseconds breaker_probe_interval{200};
  /// Errors are logged (spdlog, warn) at most once per interval, with their count. Default: 10 s.
  std::chrono::milliseconds error_log_interval{10'000};
  /// Redis Cluster: how often the slot map is read again while every slot has a master that answers
  /// (MOVED, a lost connection or a slot without a master bring a refresh sooner). Default: 10 s.
  std::chrono::milliseconds cluster_refresh_interval{10'000};
  /// Tests only: when set, the scripts take `now` from this clock instead of the Redis server's TIME
  /// (sent as an extra argument), so tests can move windows without sleeping. Never set it in
  /// production: instances would stop sharing one time source. Default: nullptr (Redis TIME).
  sluice::clock* clock_for_test = nullptr;

  bool operator==(const redis_options&) const = default;
};

}  // namespace sluice
