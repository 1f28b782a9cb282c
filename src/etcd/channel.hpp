// SPDX-License-Identifier: Apache-2.0
// src/etcd/channel.hpp (private) — one gRPC channel to one etcd endpoint: its credentials
// (plaintext, or TLS from the options' PEM files) and the channel arguments the watcher relies on.
//
//   auto creds = make_credentials(options);            // reads the TLS files once
//   auto ch = make_channel(endpoint, *creds);          // a fresh channel for each attempt
//   if (auto up = wait_connected(ch, endpoint, options.dial_timeout, stop); !up) ...
//
// Thread-safe: functions of their arguments.
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>

#include <chrono>
#include <memory>
#include <string>

#include "etcd/stopper.hpp"
#include "sluice/error.hpp"
#include "sluice/etcd/options.hpp"

namespace sluice::etcd::detail {

/// Plaintext when no TLS file is set; else TLS with the CA, certificate and key files read now.
/// Errors (invalid_argument) name the file that cannot be read.
result<std::shared_ptr<grpc::ChannelCredentials>> make_credentials(const etcd_options& options);

/// A new channel to "host:port" (as validated), sharing no connection with other channels, with
/// keepalive pings (a silent peer ends the watch within ~15 s) and a 64 MiB message bound.
std::shared_ptr<grpc::Channel> make_channel(const std::string& endpoint,
                                            const std::shared_ptr<grpc::ChannelCredentials>& credentials);

/// Waits until the channel is connected, at most `timeout`; stops early when `stop` does. Errors:
/// backend_unavailable with gRPC's reason when the connection failed, backend_timeout, cancelled.
result<void> wait_connected(const std::shared_ptr<grpc::Channel>& channel, const std::string& endpoint,
                            std::chrono::milliseconds timeout, stopper& stop);

/// The largest message the watcher accepts: a Range page or a watch response beyond it fails
/// with RESOURCE_EXHAUSTED (pages are then made smaller; a watch reads the prefix again).
inline constexpr int max_message_bytes = 64 * 1024 * 1024;

}  // namespace sluice::etcd::detail
