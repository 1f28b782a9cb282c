// SPDX-License-Identifier: Apache-2.0
#include "redis/connection.hpp"

#include <hiredis/hiredis.h>

#include <array>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/write.hpp>
#include <deque>
#include <limits>
#include <type_traits>
#include <utility>
#include <variant>

#include "redis/command.hpp"
#include "redis/scripts.hpp"
#include "sluice/host_port.hpp"

namespace sluice::detail {
namespace {

using tcp_socket = asio::ip::tcp::socket;
using unix_socket = asio::local::stream_protocol::socket;
using tls_stream = asio::ssl::stream<tcp_socket>;

// WAIT's answer `acks` (the replicas that have the held reply's writes): `fn` gets the held reply
// (an error reply too, which wrote nothing: NOSCRIPT must reach the engine as such), or an error.
void answer_waited(redisReply* held, connection::reply_fn fn, void* privdata, const redisReply& acks, int wanted,
                   const std::string& address) {
  if (fn == nullptr) return;
  if (held != nullptr &&
      (held->type == REDIS_REPLY_ERROR || (acks.type == REDIS_REPLY_INTEGER && acks.integer >= wanted))) {
    return fn(held, privdata);
  }
  std::string why = "NOREPLICAS " + address + ": the writes reached " +
                    (acks.type == REDIS_REPLY_INTEGER ? std::to_string(acks.integer) : std::string("no")) + " of " +
                    std::to_string(wanted) + " replicas (wait_replicas) within the timeout";
  redisReply error{};
  error.type = REDIS_REPLY_ERROR;
  error.str = why.data();
  error.len = why.size();
  fn(&error, privdata);
}

}  // namespace

std::string address_of(const endpoint& e) {
  if (e.unix_socket) return "unix:" + e.host;
  // An IPv6 address in brackets, as Redis Cluster spells it (cluster_topology.hpp's node_address).
  const bool v6 = e.host.find(':') != std::string::npos;
  return (v6 ? "[" + e.host + "]" : e.host) + ":" + std::to_string(e.port);
}

std::string resp_command(std::initializer_list<std::string_view> args) {
  std::string out = "*" + std::to_string(args.size()) + "\r\n";
  for (std::string_view a : args) {
    out += "$" + std::to_string(a.size()) + "\r\n";
    out += a;
    out += "\r\n";
  }
  return out;
}

result<endpoint> parse_endpoint(std::string_view a) {
  endpoint e;
  if (a.starts_with("unix:")) {
    e.host = std::string(a.substr(5));
    e.unix_socket = true;
    if (e.host.empty()) return {errc::invalid_argument, "redis address 'unix:' has no path"};
    return e;
  }
  auto hp = parse_host_port(a);
  if (!hp) return {errc::invalid_argument, "redis " + hp.error().message};
  if (hp->port == 0) return {errc::invalid_argument, "redis address '" + std::string(a) + "' has port 0"};
  e.host = std::move(hp->host);
  e.port = hp->port;
  return e;
}

// One socket and what travels on it. Its handlers hold it, so a TLS stream outlives its
// operations after the connection has moved on to a new link.
struct connection::link {
  struct pending {
    reply_fn fn;
    void* privdata;
    const char* step;    // a handshake step's name (the connection's own command), or nullptr
    bool held = false;   // wait_replicas: the reply is held for fn until WAIT's answer, the next
    bool waits = false;  // that WAIT: fn gets the held reply, or an error when too few replicas had it
  };

  link(const strand_type& strand, const endpoint& where, const tls_settings* tls) {
    if (where.unix_socket) {
      stream.emplace<unix_socket>(strand);
    } else if (tls != nullptr) {
      stream.emplace<tls_stream>(strand, *tls->context);
    } else {
      stream.emplace<tcp_socket>(strand);
    }
    reader.reset(redisReaderCreate());
    bound_replies(*reader, budget);
  }

  // f(the stream), whichever it is.
  template <class F>
  void on_stream(F&& f) {
    std::visit(
        [&](auto& s) {
          if constexpr (!std::is_same_v<std::decay_t<decltype(s)>, std::monostate>) f(s);
        },
        stream);
  }
  template <class F>
  void read_some(F&& f) {
    on_stream([&](auto& s) { s.async_read_some(asio::buffer(in), std::forward<F>(f)); });
  }
  template <class F>
  void write(F&& f) {
    on_stream([&](auto& s) { asio::async_write(s, asio::buffer(sending), std::forward<F>(f)); });
  }
  void shut() {
    boost::system::error_code ignored;
    on_stream([&](auto& s) { s.lowest_layer().close(ignored); });
  }

  // monostate only until the constructor emplaces the stream (sockets are made in place).
  std::variant<std::monostate, tcp_socket, unix_socket, tls_stream> stream;
  std::unique_ptr<redisReader, void (*)(redisReader*)> reader{nullptr, &redisReaderFree};
  std::unique_ptr<redisReply, void (*)(void*)> held{nullptr, &freeReplyObject};  // wait_replicas
  reply_budget budget{.awaited = 0};                                             // each command queued adds one
  std::deque<pending> waiting;  // one per command written or to be written, in order
  std::string unsent;           // commands queued while `sending` is on the wire
  std::string sending;
  bool connected = false;  // the socket is connected; a TLS handshake may follow
  bool up = false;         // connected and the TLS handshake made: writes may go
  bool writing = false;
  bool replied = false;  // a reply came: the server speaks RESP on this setting
  std::array<char, 16 * 1024> in;
};

connection::connection(const strand_type& strand, endpoint where, const redis_options& o,
                       std::shared_ptr<const tls_settings> tls, events e, peer who)
    : strand_(strand),
      endpoint_(std::move(where)),
      address_(address_of(endpoint_)),
      username_(who == peer::sentinel ? o.sentinel_username : o.username),
      password_(who == peer::sentinel ? o.sentinel_password : o.password),
      database_(who == peer::sentinel ? 0 : o.database),
      connect_timeout_(o.connect_timeout),
      peer_(who),
      wait_replicas_(who == peer::sentinel ? 0 : o.wait_replicas),
      wait_command_(resp_command({"WAIT", std::to_string(o.wait_replicas), std::to_string(o.command_timeout.count())})),
      tls_(endpoint_.unix_socket ? nullptr : std::move(tls)),
      events_(std::move(e)),
      connect_timer_(strand) {}

connection::~connection() { close(); }

void connection::connect() {
  if (closed_ || link_ != nullptr || resolving_) return;
  if (endpoint_.unix_socket) return connect_to(endpoint_.host);
  boost::system::error_code ec;
  asio::ip::make_address(endpoint_.host, ec);
  if (!ec) return connect_to(endpoint_.host);
  // A host name: resolve without blocking the io thread, then connect to the first address.
  resolving_ = true;
  auto resolver = std::make_shared<asio::ip::tcp::resolver>(strand_);
  resolver->async_resolve(
      endpoint_.host, std::to_string(endpoint_.port),
      asio::bind_executor(strand_, [self = shared_from_this(), resolver](
                                       boost::system::error_code ec2, asio::ip::tcp::resolver::results_type results) {
        self->resolving_ = false;
        if (self->closed_) return;
        if (ec2 || results.empty()) {
          self->events_.lost("cannot resolve " + self->endpoint_.host + ": " + ec2.message());
          return;
        }
        self->connect_to(results.begin()->endpoint().address().to_string());
      }));
}

void connection::connect_to(const std::string& host) {
  auto l = std::make_shared<link>(strand_, endpoint_, tls_.get());
  if (l->reader == nullptr) return events_.lost("cannot allocate a connection");
  if (events_.message) l->budget.awaited = std::numeric_limits<std::size_t>::max();  // pushes come unasked
  link_ = l;
  ready_ = false;
  handshake();
  // What waited for the host name to resolve goes right behind the handshake.
  events_.opened();
  if (link_ != l) return;
  auto done = [self = shared_from_this(), l](boost::system::error_code ec) {
    self->on_transport(l, ec ? "cannot connect to " + self->address_ + ": " + ec.message() : "");
  };
  if (auto* s = std::get_if<unix_socket>(&l->stream)) {
    s->async_connect(asio::local::stream_protocol::endpoint(host), asio::bind_executor(strand_, done));
  } else {
    auto& socket = std::holds_alternative<tls_stream>(l->stream) ? std::get<tls_stream>(l->stream).next_layer()
                                                                 : std::get<tcp_socket>(l->stream);
    boost::system::error_code ec;
    const asio::ip::tcp::endpoint to(asio::ip::make_address(host, ec), static_cast<unsigned short>(endpoint_.port));
    socket.async_connect(to, asio::bind_executor(strand_, done));
  }
  connect_timer_.expires_after(connect_timeout_);
  connect_timer_.async_wait(asio::bind_executor(strand_, [self = shared_from_this(), l](boost::system::error_code ec) {
    if (ec || self->link_ != l || self->ready_) return;
    self->drop(self->why_late(*l));
  }));
}

// Connected (failure empty): makes the TLS handshake where there is one, then writes what is
// queued and reads.
void connection::on_transport(const link_ptr& l, const std::string& failure) {
  if (link_ != l) return;
  if (!failure.empty()) return drop(failure);
  l->connected = true;
  if (auto* s = std::get_if<tls_stream>(&l->stream); s != nullptr && !l->up) {
    prepare_tls_client(s->native_handle(), *tls_, endpoint_.host);
    s->async_handshake(
        asio::ssl::stream_base::client,
        asio::bind_executor(strand_, [self = shared_from_this(), l](boost::system::error_code ec) {
          if (self->link_ != l) return;
          if (ec) {
            auto* ssl = std::get<tls_stream>(l->stream).native_handle();
            return self->drop("TLS handshake with " + self->address_ + " failed: " + tls_failure(ssl, ec));
          }
          l->up = true;
          self->on_transport(l, "");
        }));
    return;
  }
  l->up = true;
  flush(l);
  read(l);
}

// The handshake goes first on the connection; commands queued behind it follow in order.
void connection::handshake() {
  if (!password_.empty()) {
    queue(username_.empty() ? resp_command({"AUTH", password_}) : resp_command({"AUTH", username_, password_}), nullptr,
          nullptr, "AUTH");
  }
  if (peer_ != peer::sentinel) {
    if (peer_ == peer::master) queue(resp_command({"ROLE"}), nullptr, nullptr, "ROLE");
    if (database_ != 0) queue(resp_command({"SELECT", std::to_string(database_)}), nullptr, nullptr, "SELECT");
    for (const auto& s : scripts()) queue(resp_command({"SCRIPT", "LOAD", s.body}), nullptr, nullptr, "SCRIPT LOAD");
    queue(resp_command({"TIME"}), nullptr, nullptr, "TIME");  // the first clock offset
  }
  queue(resp_command({"PING"}), nullptr, nullptr, "PING");
}

bool connection::send(std::string_view resp, reply_fn fn, void* privdata) {
  if (link_ == nullptr) return false;
  if (wait_replicas_ > 0) {
    // Answered once `wait_replicas` replicas have the command's writes too.
    queue(resp, fn, privdata, nullptr, true);
    queue(wait_command_, fn, privdata, nullptr, false, true);
  } else {
    queue(resp, fn, privdata, nullptr);
  }
  flush(link_);
  return true;
}

void connection::queue(std::string_view resp, reply_fn fn, void* privdata, const char* step, bool held, bool waits) {
  link_->unsent += resp;
  link_->waiting.push_back({fn, privdata, step, held, waits});
  if (!events_.message) ++link_->budget.awaited;  // its reader may make one more reply (a subscriber's: any)
}

// One write at a time: what is queued meanwhile goes in the next.
void connection::flush(const link_ptr& l) {
  if (!l->up || l->writing || l->unsent.empty()) return;
  l->writing = true;
  l->sending.swap(l->unsent);
  l->write(asio::bind_executor(strand_, [self = shared_from_this(), l](boost::system::error_code ec, std::size_t) {
    l->writing = false;
    l->sending.clear();
    if (self->link_ != l) return;
    if (ec) return self->drop(self->why_lost(*l, ec));
    self->flush(l);
  }));
}

void connection::read(const link_ptr& l) {
  l->read_some(
      asio::bind_executor(strand_, [self = shared_from_this(), l](boost::system::error_code ec, std::size_t n) {
        if (self->link_ != l) return;
        if (ec) return self->drop(self->why_lost(*l, ec));
        self->on_read(l, n);
      }));
}

std::string connection::why_late(const link& l) const {
  if (!l.connected) return "no connection to " + address_ + " within connect_timeout";
  // A plaintext server waits for the end of a line that a TLS hello never sends.
  if (!l.up)
    return "TLS handshake with " + address_ +
           " failed: no answer within connect_timeout (a plaintext port? then set tls = false)";
  return "no answer from " + address_ + " to the handshake within connect_timeout";
}

std::string connection::why_lost(const link& l, const boost::system::error_code& ec) const {
  std::string why = "connection to " + address_ + " lost: " + ec.message();
  // A TLS server ends a connection that does not start with a TLS handshake.
  if (!l.replied && !tls_ && !endpoint_.unix_socket) why += " (before any reply: a TLS port? then set tls = true)";
  return why;
}

// Feeds what was read to the reader and answers each whole reply, in order. A callback may end
// the connection (drop, close): the loop stops when `l` is no longer the current link.
void connection::on_read(const link_ptr& l, std::size_t n) {
  redisReader& reader = *l->reader;
  if (redisReaderFeed(&reader, l->in.data(), n) != REDIS_OK) {
    return drop("connection to " + address_ + " dropped: " + reader.errstr);
  }
  for (;;) {
    void* reply = nullptr;
    if (redisReaderGetReply(&reader, &reply) != REDIS_OK) {
      std::string why = why_refused(l->budget);
      if (why.empty()) why = reader.errstr[0] != '\0' ? reader.errstr : "unreadable reply";
      return drop("connection to " + address_ + " dropped: " + why);
    }
    if (reply == nullptr) break;
    l->replied = true;
    auto* r = static_cast<redisReply*>(reply);
    if (l->waiting.empty()) {
      // The budget let it through: a subscriber's message.
      events_.message(*r);
      freeReplyObject(r);
      if (link_ != l) return;
      continue;
    }
    link::pending p = l->waiting.front();
    l->waiting.pop_front();
    if (p.step != nullptr) {
      on_handshake_reply(p.step, *r);
    } else if (p.held) {
      l->held.reset(r);
      continue;
    } else if (p.waits) {
      auto held = std::move(l->held);
      answer_waited(held.get(), p.fn, p.privdata, *r, wait_replicas_, address_);
    } else if (p.fn != nullptr) {
      p.fn(r, p.privdata);
    }
    freeReplyObject(r);
    if (link_ != l) return;
  }
  // What is held after the whole replies are read is the reply being read: one that grows past
  // its bounds ends the connection.
  if (std::string why = overlong_reply(reader); !why.empty()) {
    return drop("connection to " + address_ + " dropped: " + why);
  }
  read(l);
}

void connection::on_handshake_reply(const char* step, const redisReply& reply) {
  const std::string_view name = step;
  if (reply.type == REDIS_REPLY_ERROR) {
    return drop(std::string(name) + " failed on " + address_ + ": " + std::string(reply.str, reply.len));
  }
  if (name == "ROLE") {
    // ROLE's first element: "master", "slave" or "sentinel".
    const bool master = reply.type == REDIS_REPLY_ARRAY && reply.elements > 0 &&
                        reply.element[0]->type == REDIS_REPLY_STRING &&
                        std::string_view(reply.element[0]->str, reply.element[0]->len) == "master";
    if (!master) {
      std::string role = "nothing readable";
      if (reply.type == REDIS_REPLY_ARRAY && reply.elements > 0 && reply.element[0]->type == REDIS_REPLY_STRING) {
        role = "\"" + std::string(reply.element[0]->str, std::min<std::size_t>(reply.element[0]->len, 32)) + "\"";
      }
      return drop(address_ + " is not a master (ROLE says " + role + "): nothing is sent to it");
    }
  } else if (name == "TIME") {
    if (std::int64_t t = parse_time_reply(reply); t >= 0) events_.server_time(t);
  } else if (name == "PING") {
    ready_ = true;
    connect_timer_.cancel();
    events_.ready();
  }
}

void connection::drop(const std::string& why) { end(why, true); }

void connection::drop_soon(const std::string& why) {
  asio::post(strand_, [self = shared_from_this(), l = link_, why] {
    if (l != nullptr && self->link_ == l) self->drop(why);
  });
}

void connection::close() {
  if (closed_) return;
  closed_ = true;
  connect_timer_.cancel();
  end("", false);
}

// The link goes first, so what its callbacks send or drop meets no connection; then the callbacks
// get null replies; then the owner hears why.
void connection::end(const std::string& why, bool tell) {
  link_ptr l = std::move(link_);
  link_ = nullptr;
  ready_ = false;
  if (l == nullptr) return;
  l->shut();
  auto waiting = std::move(l->waiting);
  l->waiting.clear();
  for (const auto& p : waiting) {
    // A held reply's callback is its WAIT's.
    if (p.step == nullptr && !p.held && p.fn != nullptr) p.fn(nullptr, p.privdata);
  }
  if (tell) events_.lost(why);
}

}  // namespace sluice::detail
