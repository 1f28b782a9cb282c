// src/redis/connection.hpp — one hiredis connection to one Redis server, driven on an Asio strand.
//
// connect() resolves a host name without blocking the io thread, connects, and queues the
// handshake: AUTH (with the user name when one is set), SELECT, SCRIPT LOAD of every script, TIME
// (the first reading of the server's clock) and PING, whose answer makes the connection ready.
// Commands sent meanwhile and after (send) are pipelined behind it and each other, in order; each
// callback gets its reply, or a null reply when the connection goes away. A refused handshake
// step, no answer within connect_timeout, a failed connect, a lost connection or a reply no command
// waits for end it: `lost` says why, and a later connect() makes a new one (when is the owner's
// breaker's business).
//
//   auto c = std::make_shared<detail::connection>(strand, *parse_endpoint("10.0.0.5:6379"), options,
//                                                 detail::connection::events{...});
//   c->connect();                                  // on the strand, as every call
//   if (c->open()) c->send(text, &on_reply, box);  // RESP text, e.g. command.hpp's
//
// Not thread-safe: every call, and every event, on the strand. The owner's events must stay valid
// until close(); the connection outlives its owner only as long as its own waits.
#pragma once

#include <hiredis/async.h>

#include <boost/asio/steady_timer.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "redis/command.hpp"
#include "redis/strand.hpp"
#include "sluice/error.hpp"
#include "sluice/redis_options.hpp"

namespace sluice::detail {

/// Where one Redis server listens.
struct endpoint {
  std::string host;  ///< A name or an address, or the unix socket's path.
  int port = 0;
  bool unix_socket = false;
};

/// "host:port", "[v6addr]:port" (port 1..65535) or "unix:/path"; else errc::invalid_argument.
result<endpoint> parse_endpoint(std::string_view address);

class connection : public std::enable_shared_from_this<connection> {
 public:
  /// What the connection tells its owner, on the strand.
  struct events {
    /// A new context exists: what is sent from now on follows its handshake.
    std::function<void()> opened;
    /// The handshake's PING was answered.
    std::function<void()> ready;
    /// The connection is gone, or could not be made; why, for the log.
    std::function<void(const std::string& why)> lost;
    /// TIME's answer at the handshake, in server µs.
    std::function<void(std::int64_t server_us)> server_time;
  };

  connection(const strand_type& strand, endpoint where, const redis_options& o, events e);

  /// Starts a connection unless one exists, a host name is being resolved, or close() was called.
  void connect();
  /// A host name is being resolved (a connection will follow).
  bool resolving() const noexcept { return resolving_; }
  /// A context exists: connected or handshaking.
  bool open() const noexcept { return ac_ != nullptr; }
  /// True when `ac` is this connection's current context (a callback's reply is from it).
  bool is_current(const redisAsyncContext* ac) const noexcept { return ac != nullptr && ac == ac_; }

  /// Queues `resp` (one formatted command) behind everything sent before. False when it could not
  /// be queued (no context): `fn` will not be called.
  bool send(std::string_view resp, redisCallbackFn* fn, void* privdata);

  /// Frees the context now (never from inside one of its callbacks): callbacks get null replies,
  /// then `lost(why)`.
  void drop(const std::string& why);
  /// drop(why) next on the strand, if this context is still the current one: from inside its
  /// callbacks.
  void drop_soon(const std::string& why);

  /// The end: frees the context (callbacks get null replies), stops every wait, no more events.
  void close();

  /// "host:port" or "unix:/path", for logs.
  const std::string& address() const noexcept { return address_; }

 private:
  void connect_to(const std::string& host);
  void handshake(redisAsyncContext* ac);
  void on_handshake_done();
  void lost(const std::string& why);
  bool queued(int status);

  static void on_connect(const redisAsyncContext* ac, int status);
  static void on_disconnect(const redisAsyncContext* ac, int status);
  static void after_read(redisAsyncContext* ac);
  static void on_handshake(redisAsyncContext* ac, void* reply, void* step);
  static void on_time(redisAsyncContext* ac, void* reply, void*);

  strand_type strand_;
  const endpoint endpoint_;
  const std::string address_;
  const std::string username_;
  const std::string password_;
  const int database_;
  const std::chrono::milliseconds connect_timeout_;
  const events events_;
  asio::steady_timer connect_timer_;

  redisAsyncContext* ac_ = nullptr;
  reply_budget reply_budget_;     // of the context's reader
  std::uint64_t generation_ = 0;  // one per context, so a late wait knows it is stale
  bool ready_ = false;
  bool resolving_ = false;
  bool closed_ = false;
};

}  // namespace sluice::detail
