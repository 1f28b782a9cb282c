// SPDX-License-Identifier: Apache-2.0
// sluice/etcd/options.hpp — where a prefix watcher finds etcd, what it watches, and its bounds.
//
//   sluice::etcd::etcd_options o{.endpoints = {"10.0.0.5:2379", "10.0.0.6:2379"},
//                                .prefix = "/sluice/rules/",
//                                .username = "sluice", .password = secret,
//                                .ca_file = "/etc/sluice/etcd-ca.pem"};
//   if (auto ok = sluice::etcd::validate(o); !ok) return fail(ok.error().message);
//
// Thread-safe: values and a pure function.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "sluice/error.hpp"

namespace sluice::etcd {

struct etcd_options {
  /// Members of the etcd cluster as "host:port" ("[v6addr]:port" for IPv6), tried in turn.
  /// Default: {"127.0.0.1:2379"}.
  std::vector<std::string> endpoints{"127.0.0.1:2379"};
  /// Every key that starts with it is watched; keys are reported without it. Empty watches the
  /// whole keyspace. Default: "/sluice/".
  std::string prefix = "/sluice/";
  /// User for etcd's authentication; empty means no authentication. Default: "".
  std::string username;
  /// That user's password. Default: "".
  std::string password;
  /// TLS: a PEM file of the certificate authorities that sign the servers' certificates. Setting
  /// any of the three TLS files turns TLS on; with `ca_file` empty the system's roots are used.
  /// The files are read once, by `prefix_watcher::create`. Default: "" (plaintext).
  std::string ca_file;
  /// TLS: this client's certificate chain (PEM), for servers started with --client-cert-auth;
  /// needs `key_file`. Default: "".
  std::string cert_file;
  /// TLS: the private key of `cert_file` (PEM). Default: "".
  std::string key_file;
  /// Longest a connection to one endpoint may take to be established. Default: 5000 ms.
  std::chrono::milliseconds dial_timeout{5000};
  /// Longest one Authenticate or Range call (one page of a full read) may take. Default: 10000 ms.
  std::chrono::milliseconds request_timeout{10'000};
  /// The wait before reconnecting after a failure is drawn between half and all of
  /// min(backoff_cap, backoff_base × 2^(failures in a row)). Default: 200 ms.
  std::chrono::milliseconds backoff_base{200};
  /// Longest wait between two attempts to connect. Default: 10,000 ms.
  std::chrono::milliseconds backoff_cap{10'000};
  /// Most keys a snapshot holds; keys beyond it are left out and reported. Default: 100,000.
  std::size_t max_keys = 100'000;
  /// Largest value a snapshot holds; a key whose value is larger is left out and reported.
  /// Default: 65,536 bytes.
  std::size_t max_value_bytes = 64 * 1024;
  /// Longest key (prefix included) a snapshot holds; longer keys are left out and reported.
  /// Default: 1,024 bytes.
  std::size_t max_key_bytes = 1024;

  bool operator==(const etcd_options&) const = default;
};

/// Checks the options: at least one endpoint, each a valid host:port (port 1 to 65535); a password
/// only with a username; cert_file and key_file together; positive timeouts; 0 < backoff_base <=
/// backoff_cap <= 10 min; max_keys, max_value_bytes and max_key_bytes at least 1. Errors are
/// errc::invalid_argument, naming the option. The TLS files are read (and so checked) only by
/// `prefix_watcher::create`.
result<void> validate(const etcd_options& options);

}  // namespace sluice::etcd
