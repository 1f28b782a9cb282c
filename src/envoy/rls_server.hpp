// SPDX-License-Identifier: Apache-2.0
// src/envoy/rls_server.hpp — Envoy's RateLimitService over gRPC: rls_service behind grpc_server
// (HTTP/2 on nghttp2, a connection per io thread, one io thread per core). An in-process backend
// answers on the io thread that read the call; Redis answers on its own thread, posted back.
// Also serves grpc.health.v1.Health/Check, which Envoy's and Kubernetes' gRPC probes call.
//
//   auto server = rls_server::start("127.0.0.1:8081", rls, grpc_limits{});  // "host:0": a free port
//   server->port();  ...  server->shutdown(std::chrono::seconds(5));
//
// Thread-safe.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "envoy/rls_service.hpp"
#include "sluice/envoy/options.hpp"
#include "sluice/error.hpp"

namespace sluice::envoy {

class grpc_server;

class rls_server {
 public:
  /// Listens on `address` ("host:port", IPv6 as "[::1]:8081"). Errors: the address cannot be bound.
  static result<std::unique_ptr<rls_server>> start(const std::string& address, rls_service& service,
                                                   const grpc_limits& limits = {});
  ~rls_server();

  int port() const noexcept;
  /// Stops accepting calls and waits for those running, at most `grace` (then closes their
  /// connections); returns once no call is still deciding.
  void shutdown(std::chrono::milliseconds grace);
  /// The connections: open, accepted, and closed by the server by reason.
  void append_metrics(std::string& prometheus_text) const;

 private:
  explicit rls_server(std::unique_ptr<grpc_server> s);
  std::unique_ptr<grpc_server> server_;
};

}  // namespace sluice::envoy
