// src/envoy/rls_server.hpp — Envoy's RateLimitService over gRPC: rls_service behind a gRPC server
// (the async API: a completion queue and its thread per core, no thread per call; an in-process
// backend answers on the queue's thread, Redis on its connection's).
//
//   auto server = rls_server::start("127.0.0.1:8081", rls);   // "host:0" picks a free port
//   server->port();  ...  server->shutdown(std::chrono::seconds(5));
//
// Thread-safe.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "envoy/rls_service.hpp"
#include "sluice/error.hpp"

namespace sluice::envoy {

/// The largest request accepted (Envoy's are a few hundred bytes), and the memory all calls may
/// hold at once: hostile clients get RESOURCE_EXHAUSTED, not the process's memory.
inline constexpr int max_request_bytes = 64 << 10;
inline constexpr std::size_t max_grpc_memory = std::size_t{256} << 20;

class rls_server {
 public:
  /// Listens on `address` ("host:port", IPv6 as "[::1]:8081"). Errors: the address cannot be bound.
  static result<std::unique_ptr<rls_server>> start(const std::string& address, rls_service& service);
  ~rls_server();

  int port() const noexcept { return port_; }
  /// Stops accepting calls and waits for those running, at most `grace` (then cancels them).
  void shutdown(std::chrono::milliseconds grace);

 private:
  struct impl;
  explicit rls_server(std::unique_ptr<impl> i, int port);
  std::unique_ptr<impl> impl_;
  int port_;
};

}  // namespace sluice::envoy
