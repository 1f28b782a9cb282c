// SPDX-License-Identifier: Apache-2.0
// One client connection of sluiced: reads a request (within the bounds of request_limits.hpp),
// routes it (/v1/check, /healthz, /readyz, /metrics), runs its checks and writes the answer,
// including the 429s. Lives on one worker thread; the worker is the io thread that owns it.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include "core/published.hpp"
#include "sluice/clock.hpp"
#include "server/api.hpp"
#include "server/request_limits.hpp"
#include "server/snapshot.hpp"

namespace sluice::server {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using steady = std::chrono::steady_clock;
using executor = asio::io_context::executor_type;

// A connection waiting for a request is closed after idle_timeout; one being answered after
// write_timeout.
constexpr auto idle_timeout = std::chrono::seconds(60);
constexpr auto write_timeout = std::chrono::seconds(30);
// While draining, how long a connection waiting between requests may still send one.
constexpr auto drain_grace = std::chrono::milliseconds(500);

class session;
struct worker;
class rejection_log;
class metrics;

// What a connection needs of the service that accepted it, and nothing more (the service
// implements it): the rules in force, the backend, the counters, the drain flag.
class connection_context {
 public:
  virtual ~connection_context() = default;
  // The config in force as worker `w` sees it (one atomic load).
  virtual const std::shared_ptr<const snapshot>& current_for(worker& w) const = 0;
  virtual sluice::backend& backend() = 0;
  virtual server::metrics& stats() = 0;
  virtual rejection_log& rejections() = 0;
  virtual bool draining() const = 0;
  virtual void request_begin() = 0;
  virtual void request_end() = 0;
  virtual std::string render_metrics() = 0;                    // GET /metrics
  virtual std::string render_rules(const snapshot& snap) = 0;  // GET /v1/rules
};

// One io thread: its io_context, the connections it owns and their idle sweeper. Everything here is
// touched only from that thread.
struct worker {
  // Connections accepted for this worker whose session has not ended yet. Declared before `io`:
  // sessions still held by its handlers decrement it as the io_context is destroyed.
  std::size_t open = 0;
  asio::io_context io{1};
  asio::steady_timer sweep_timer{io};
  std::vector<std::weak_ptr<session>> sessions;
  // This thread's view of the current config (connection_context::current_for).
  published<snapshot>::view snap;
};

// Coarse monotonic nanoseconds: deadlines need ~ms precision and are read on every request.
inline std::int64_t coarse_now_ns() { return to_ns(coarse_clock().now()); }

// One connection: read a request, answer it, repeat while keep-alive. Lives on one worker thread;
// backend completions from other threads are posted back to it.
class session : public std::enable_shared_from_this<session> {
 public:
  session(asio::basic_stream_socket<tcp, executor>&& socket, connection_context& svc, worker& w)
      : socket_(std::move(socket)), svc_(svc), worker_(w) {
    ++worker_.open;  // constructed and destroyed on the worker's thread
  }
  ~session();

  // Runs on the worker's thread. At the connection cap, first closes this worker's connection that
  // has waited longest for a request, so that slow or idle clients cannot lock new ones out.
  void start(std::size_t max_open) {
    if (worker_.open > max_open && !close_longest_waiting(worker_)) {
      beast::error_code ec;
      socket_.close(ec);  // nothing can be shed: this connection is refused
      return;
    }
    worker_.sessions.push_back(shared_from_this());
    do_read();
  }

  // SIGTERM: see the definition.
  void drain();

  bool waiting() const { return waiting_; }
  std::int64_t waiting_since() const { return waiting_since_ns_; }
  // Closes this waiting connection to make room for a new one. It no longer counts as waiting, so
  // that the next connection over the cap sheds another one, not this one again (its session lives
  // on until its aborted read completes).
  void shed() {
    waiting_ = false;
    beast::error_code ec;
    socket_.close(ec);
  }

  // Called by the worker's sweeper: closes the connection when its current deadline has passed.
  void sweep(std::int64_t now_ns) {
    if (now_ns > deadline_ns_) {
      beast::error_code ec;
      socket_.close(ec);  // pending operations complete with operation_aborted
    }
  }

 private:
  static bool close_longest_waiting(worker& w);
  void count_in_flight();
  void set_deadline(std::chrono::nanoseconds d) { deadline_ns_ = coarse_now_ns() + d.count(); }
  void clear_deadline() { deadline_ns_ = std::numeric_limits<std::int64_t>::max(); }

  void do_read();
  void on_header(beast::error_code ec, std::size_t);
  bool reply_read_error(beast::error_code ec);
  void read_body();
  void on_read(beast::error_code ec, std::size_t);
  void handle();
  void handle_check();
  void on_check_done(std::size_t index, result<decision> r);
  void finish_check();
  void handle_reset();
  void finish_reset(result<void> r);
  void reply(bhttp::status status, std::string_view body, std::string_view content_type);
  void reply_error(const api_error& e);
  void on_write(bool close, beast::error_code ec, std::size_t);
  void close();
  void discard();

  asio::basic_stream_socket<tcp, executor> socket_;
  connection_context& svc_;
  worker& worker_;
  std::int64_t deadline_ns_ = std::numeric_limits<std::int64_t>::max();
  bool waiting_ = false;  // between requests: no byte of the next one parsed yet
  std::int64_t waiting_since_ns_ = 0;
  beast::flat_buffer buffer_{max_buffered_bytes};
  chunk_framing_budget chunk_framing_;  // of the request being read; the parser holds a reference
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  bhttp::request<bhttp::string_body> req_;
  std::string extra_headers_;  // "Name: value\r\n" lines for the response being built
  std::string out_;            // the serialized response
  std::array<char, 4096> discard_buf_;
  std::size_t discarded_ = 0;
  bool counted_ = false;  // this request counts as in flight

  // The check in progress.
  std::shared_ptr<const snapshot> snap_;
  check_batch batch_;
  std::vector<std::optional<result<decision>>> results_;
  std::size_t outstanding_ = 0;
  steady::time_point started_;
  check_item reset_;  // the reset in progress: its request's views point into it
};

}  // namespace sluice::server
