// SPDX-License-Identifier: Apache-2.0
// src/envoy/grpc_server.hpp — unary gRPC calls over HTTP/2 (nghttp2) on Asio io threads, with every
// resource a peer can hold bounded: connections, streams, header blocks, request bytes, answers
// it never reads, resets, idle and old connections.
//
//   grpc_server::methods m;
//   m["/pkg.Service/Method"] = [](std::string_view request, grpc_responder r) {
//     r.finish(grpc_code::ok, "", answer_bytes);              // from any thread, exactly once
//   };
//   auto server = grpc_server::start("127.0.0.1:0", std::move(m), grpc_limits{});
//   server->port();  ...  server->shutdown(std::chrono::seconds(5));
//
// A connection lives on one io thread (one per core); a method runs on that thread and may answer
// later from any other (a Redis reply): the answer is posted back. Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>

#include "sluice/envoy/options.hpp"
#include "sluice/error.hpp"

namespace sluice::envoy {

/// gRPC's status codes (grpc/status.h), as sent in `grpc-status`.
enum class grpc_code : int {
  ok = 0,
  cancelled = 1,
  unknown = 2,
  invalid_argument = 3,
  deadline_exceeded = 4,
  not_found = 5,
  resource_exhausted = 8,
  unimplemented = 12,
  internal = 13,
  unavailable = 14,
};

/// The largest header block (HPACK-decoded, RFC 9113's size: name + value + 32 per field) a peer
/// may send; advertised as SETTINGS_MAX_HEADER_LIST_SIZE. A larger block closes the connection as
/// soon as it passes the bound, however many frames it is split into.
inline constexpr std::size_t max_header_list_bytes = 8192;

/// How a connection was closed by the server (counted in `grpc_server::stats`).
enum class close_reason : std::uint8_t {
  idle,          // no call for idle_timeout
  aged,          // max_connection_age, then its grace
  shed,          // the longest idle, closed to make room at max_connections
  refused,       // at max_connections with nothing idle to shed
  header_limit,  // a header block over max_header_list_bytes
  protocol,      // an HTTP/2 error, a flood nghttp2 refused (SETTINGS, PING, resets), a bad preface
  resets,        // streams reset or left unanswered faster than reset_burst / resets_per_second
  stalled,       // answers or writes unread for write_timeout
  shutdown,
  count_
};

class grpc_server;
struct grpc_connection;

/// Answers one call, once: on the connection's thread or any other. An answer to a call whose
/// stream or connection has gone is dropped. Destroying an unanswered responder answers INTERNAL.
class grpc_responder {
 public:
  grpc_responder() = default;
  grpc_responder(std::shared_ptr<grpc_connection> c, std::int32_t stream);
  grpc_responder(grpc_responder&&) noexcept = default;
  grpc_responder& operator=(grpc_responder&&) noexcept;
  ~grpc_responder();

  /// `message` is the serialized answer, sent only with grpc_code::ok; `detail` goes in
  /// `grpc-message` otherwise.
  void finish(grpc_code code, std::string_view detail, std::string_view message = {});

 private:
  std::shared_ptr<grpc_connection> connection_;
  std::int32_t stream_ = 0;
};

class grpc_server {
 public:
  /// A unary method: the request's one message (not decompressed: compressed requests are refused
  /// before) and its responder. Runs on the connection's io thread.
  using method = std::function<void(std::string_view request, grpc_responder responder)>;
  using methods = std::unordered_map<std::string, method>;  // by :path, "/package.Service/Method"

  struct stats {
    std::atomic<std::uint64_t> open{0};      // connections now
    std::atomic<std::uint64_t> accepted{0};  // connections ever
    std::atomic<std::uint64_t> closed[static_cast<int>(close_reason::count_)]{};
  };

  /// Listens on `address` ("host:port", IPv6 as "[::1]:8081"). Errors: the address cannot be bound.
  static result<std::unique_ptr<grpc_server>> start(const std::string& address, methods m, const grpc_limits& limits);
  ~grpc_server();

  int port() const noexcept;
  const stats& counters() const noexcept;
  /// Stops accepting; connections are told GOAWAY and their calls get `grace` to answer; then every
  /// connection closes, and this returns once no method's call is still unanswered.
  void shutdown(std::chrono::milliseconds grace);

  struct impl;

 private:
  explicit grpc_server(std::unique_ptr<impl> i);
  std::unique_ptr<impl> impl_;
};

/// The name of a close_reason, as in metrics' `reason` label.
std::string_view close_reason_name(close_reason r);

}  // namespace sluice::envoy
