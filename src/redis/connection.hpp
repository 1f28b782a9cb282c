// SPDX-License-Identifier: Apache-2.0
// src/redis/connection.hpp — one connection to one Redis server, driven on an Asio strand.
//
// The connection does its own I/O on Asio — plain TCP, a Unix socket, or TLS over TCP (tls.hpp) —
// and reads RESP with hiredis's reply reader, within the reply bounds of command.hpp.
// connect() resolves a host name without blocking the io thread, connects (and makes the TLS
// handshake), and queues the Redis handshake: AUTH (with the user name when one is set), ROLE (a
// Sentinel's master only: a replica or a sentinel named by mistake never becomes ready), SELECT,
// SCRIPT LOAD of every script, TIME (the first reading of the server's clock) and PING, whose
// answer makes the connection ready; a sentinel's handshake is its own AUTH and PING. Commands sent meanwhile and after
// (send) are pipelined behind it and each other, in order; each callback gets its reply, or a null reply when the
// connection goes away. With wait_replicas, each command sent is followed by WAIT, and its callback gets its reply once
// that many replicas have its writes, or a NOREPLICAS error reply when they did not within command_timeout. A refused
// handshake step, no answer within connect_timeout, a failed connect or TLS handshake, a lost connection or a reply no
// command waits for end it: `lost` says why, and a later connect() makes a new one (when is the owner's breaker's
// business).
//
//   auto c = std::make_shared<detail::connection>(strand, *parse_endpoint("10.0.0.5:6379"), options,
//                                                 tls, detail::connection::events{...});
//   c->connect();                                  // on the strand, as every call
//   if (c->open()) c->send(text, &on_reply, box);  // RESP text, e.g. command.hpp's
//
// Not thread-safe: every call, and every event, on the strand. The owner's events must stay valid
// until close(); the connection outlives its owner only as long as its own waits.
#pragma once

#include <boost/asio/steady_timer.hpp>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>

#include "redis/strand.hpp"
#include "redis/tls.hpp"
#include "sluice/error.hpp"
#include "sluice/redis_options.hpp"

struct redisReply;  // <hiredis/hiredis.h>

namespace sluice::detail {

/// Where one Redis server listens.
struct endpoint {
  std::string host;  ///< A name or an address, or the unix socket's path.
  int port = 0;
  bool unix_socket = false;

  bool operator==(const endpoint&) const = default;
};

/// "host:port" or "unix:/path", for logs and as a node's name.
std::string address_of(const endpoint& e);

/// One command in RESP, from its arguments.
std::string resp_command(std::initializer_list<std::string_view> args);

/// "host:port", "[v6addr]:port" (port 1..65535) or "unix:/path"; else errc::invalid_argument.
result<endpoint> parse_endpoint(std::string_view address);

/// What a node (node.hpp) needs of its connection: `connection` below, or a fake in tests.
class node_connection {
 public:
  /// A command's reply, or nullptr when the connection went away first. The reply is freed after
  /// the call.
  using reply_fn = void (*)(redisReply* reply, void* privdata);

  virtual ~node_connection() = default;
  virtual void connect() = 0;
  virtual bool resolving() const noexcept = 0;
  virtual bool open() const noexcept = 0;
  virtual bool send(std::string_view resp, reply_fn fn, void* privdata) = 0;
  virtual void drop_soon(const std::string& why) = 0;
  virtual void close() = 0;
  virtual const std::string& address() const noexcept = 0;
  virtual const endpoint& where() const noexcept = 0;
};

class connection final : public node_connection, public std::enable_shared_from_this<connection> {
 public:
  /// Who is on the other end, which sets the handshake.
  enum class peer : std::uint8_t {
    server,    ///< One Redis, or a Cluster node: the scripts run there.
    master,    ///< A master a sentinel named: the same, once ROLE says "master".
    sentinel,  ///< A sentinel: AUTH with the sentinel_ credentials; no scripts.
  };

  /// What the connection tells its owner, on the strand.
  struct events {
    /// A new connection is being made: what is sent from now on follows its handshake.
    std::function<void()> opened;
    /// The handshake's PING was answered.
    std::function<void()> ready;
    /// The connection is gone, or could not be made; why, for the log.
    std::function<void(const std::string& why)> lost;
    /// TIME's answer at the handshake, in server µs.
    std::function<void(std::int64_t server_us)> server_time;
    /// A subscriber's: a message no command waits for (a SUBSCRIBE's pushes). Unset: such a
    /// reply ends the connection.
    std::function<void(const redisReply& message)> message;
  };

  /// `tls`: the TLS settings of every connection of the backend, or nullptr for plaintext.
  connection(const strand_type& strand, endpoint where, const redis_options& o, std::shared_ptr<const tls_settings> tls,
             events e, peer who = peer::server);
  ~connection() override;

  /// Starts a connection unless one exists, a host name is being resolved, or close() was called.
  void connect() override;
  /// A host name is being resolved (a connection will follow).
  bool resolving() const noexcept override { return resolving_; }
  /// A connection exists: connecting, handshaking or ready.
  bool open() const noexcept override { return link_ != nullptr; }

  /// Queues `resp` (one formatted command) behind everything sent before; `fn` (may be null: the
  /// reply is not wanted) gets its reply. False when it could not be queued (no connection): `fn`
  /// will not be called.
  bool send(std::string_view resp, reply_fn fn, void* privdata) override;

  /// Ends the connection now: callbacks get null replies, then `lost(why)`. Also from inside a
  /// callback.
  void drop(const std::string& why);
  /// drop(why) next on the strand, if this connection is still the current one.
  void drop_soon(const std::string& why) override;

  /// The end: callbacks get null replies, every wait stops, no more events.
  void close() override;

  /// "host:port" or "unix:/path", for logs.
  const std::string& address() const noexcept override { return address_; }
  const endpoint& where() const noexcept override { return endpoint_; }

 private:
  struct link;  // one socket (and its TLS stream, reader and queues); a new one per connection
  using link_ptr = std::shared_ptr<link>;

  void connect_to(const std::string& host);
  void on_transport(const link_ptr& l, const std::string& failure);
  void handshake();
  void queue(std::string_view resp, reply_fn fn, void* privdata, const char* step, bool held = false,
             bool waits = false);
  void flush(const link_ptr& l);
  void read(const link_ptr& l);
  void on_read(const link_ptr& l, std::size_t n);
  void on_handshake_reply(const char* step, const redisReply& reply);
  std::string why_late(const link& l) const;
  std::string why_lost(const link& l, const boost::system::error_code& ec) const;
  void end(const std::string& why, bool tell);

  strand_type strand_;
  const endpoint endpoint_;
  const std::string address_;
  const std::string username_;
  const std::string password_;
  const int database_;
  const std::chrono::milliseconds connect_timeout_;
  const peer peer_;
  const int wait_replicas_;  // WAIT for that many replicas after each command sent (0: never)
  const std::string wait_command_;
  const std::shared_ptr<const tls_settings> tls_;
  const events events_;
  asio::steady_timer connect_timer_;

  link_ptr link_;
  bool ready_ = false;
  bool resolving_ = false;
  bool closed_ = false;
};

}  // namespace sluice::detail
