#include "redis/connection.hpp"

#include <hiredis/hiredis.h>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <utility>

#include "redis/asio_hiredis.hpp"
#include "redis/command.hpp"
#include "redis/scripts.hpp"
#include "sluice/host_port.hpp"

namespace sluice::detail {
namespace {

std::string address_of(const endpoint& e) {
  return e.unix_socket ? "unix:" + e.host : e.host + ":" + std::to_string(e.port);
}

}  // namespace

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

connection::connection(const strand_type& strand, endpoint where, const redis_options& o, events e)
    : strand_(strand),
      endpoint_(std::move(where)),
      address_(address_of(endpoint_)),
      username_(o.username),
      password_(o.password),
      database_(o.database),
      connect_timeout_(o.connect_timeout),
      events_(std::move(e)),
      connect_timer_(strand) {}

void connection::connect() {
  if (closed_ || ac_ != nullptr || resolving_) return;
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
          self->lost("cannot resolve " + self->endpoint_.host + ": " + ec2.message());
          return;
        }
        self->connect_to(results.begin()->endpoint().address().to_string());
      }));
}

void connection::connect_to(const std::string& host) {
  redisAsyncContext* ac =
      endpoint_.unix_socket ? redisAsyncConnectUnix(host.c_str()) : redisAsyncConnect(host.c_str(), endpoint_.port);
  if (ac == nullptr) return lost("cannot allocate a connection");
  if (ac->err) {
    std::string why = "cannot connect to " + address_ + ": " + ac->errstr;
    redisAsyncFree(ac);
    return lost(why);
  }
  reply_budget_ = {.awaited = 0};  // each command queued adds one (queued)
  bound_replies(*ac->c.reader, reply_budget_);
  ac->data = this;
  attach(ac, strand_, &connection::after_read);
  redisAsyncSetConnectCallback(ac, &connection::on_connect);
  redisAsyncSetDisconnectCallback(ac, &connection::on_disconnect);
  ac_ = ac;
  ++generation_;
  handshake(ac);
  // What waited for the host name to resolve goes right behind the handshake.
  events_.opened();
  connect_timer_.expires_after(connect_timeout_);
  connect_timer_.async_wait(
      asio::bind_executor(strand_, [self = shared_from_this(), gen = generation_](boost::system::error_code ec) {
        if (ec || self->closed_ || gen != self->generation_ || self->ready_ || self->ac_ == nullptr) return;
        self->drop("no connection to " + self->address_ + " within connect_timeout");
      }));
}

// The handshake goes first on the connection; commands queued behind it follow in order.
void connection::handshake(redisAsyncContext* ac) {
  if (!password_.empty()) {
    if (username_.empty()) {
      const char* argv[] = {"AUTH", password_.c_str()};
      const std::size_t lens[] = {4, password_.size()};
      queued(redisAsyncCommandArgv(ac, &connection::on_handshake, const_cast<char*>("AUTH"), 2, argv, lens));
    } else {
      const char* argv[] = {"AUTH", username_.c_str(), password_.c_str()};
      const std::size_t lens[] = {4, username_.size(), password_.size()};
      queued(redisAsyncCommandArgv(ac, &connection::on_handshake, const_cast<char*>("AUTH"), 3, argv, lens));
    }
  }
  if (database_ != 0) {
    std::string db = std::to_string(database_);
    const char* argv[] = {"SELECT", db.c_str()};
    const std::size_t lens[] = {6, db.size()};
    queued(redisAsyncCommandArgv(ac, &connection::on_handshake, const_cast<char*>("SELECT"), 2, argv, lens));
  }
  for (const auto& s : scripts()) {
    const char* argv[] = {"SCRIPT", "LOAD", s.body.c_str()};
    const std::size_t lens[] = {6, 4, s.body.size()};
    queued(redisAsyncCommandArgv(ac, &connection::on_handshake, const_cast<char*>("SCRIPT LOAD"), 3, argv, lens));
  }
  queued(redisAsyncCommand(ac, &connection::on_time, nullptr, "TIME"));  // the first clock offset
  queued(redisAsyncCommand(ac, &connection::on_handshake, const_cast<char*>("PING"), "PING"));
}

bool connection::send(std::string_view resp, redisCallbackFn* fn, void* privdata) {
  if (ac_ == nullptr) return false;
  return queued(redisAsyncFormattedCommand(ac_, fn, privdata, resp.data(), resp.size()));
}

// hiredis queued a callback for the command (status REDIS_OK): its reader may make one more reply.
bool connection::queued(int status) {
  if (status != REDIS_OK) return false;
  ++reply_budget_.awaited;
  return true;
}

void connection::drop(const std::string& why) {
  redisAsyncContext* ac = ac_;
  ac_ = nullptr;  // first: the callbacks hiredis runs while freeing it see a context no longer ours
  if (ac != nullptr) redisAsyncFree(ac);
  lost(why);
}

void connection::drop_soon(const std::string& why) {
  asio::post(strand_, [self = shared_from_this(), gen = generation_, why] {
    if (gen == self->generation_ && self->ac_ != nullptr) self->drop(why);
  });
}

void connection::close() {
  if (closed_) return;
  closed_ = true;
  connect_timer_.cancel();
  redisAsyncContext* ac = ac_;
  ac_ = nullptr;
  if (ac != nullptr) redisAsyncFree(ac);  // waiting callbacks get null replies
}

void connection::lost(const std::string& why) {
  ready_ = false;
  events_.lost(why);
}

void connection::on_handshake_done() {
  ready_ = true;
  connect_timer_.cancel();
  events_.ready();
}

void connection::on_connect(const redisAsyncContext* ac, int status) {
  auto* self = static_cast<connection*>(ac->data);
  if (status == REDIS_OK || ac != self->ac_) return;
  // hiredis frees the context after this callback.
  self->ac_ = nullptr;
  self->lost("cannot connect to " + self->address_ + ": " + (ac->errstr ? ac->errstr : "error"));
}

void connection::on_disconnect(const redisAsyncContext* ac, int /*status*/) {
  auto* self = static_cast<connection*>(ac->data);
  if (ac != self->ac_) return;  // we dropped it ourselves
  self->ac_ = nullptr;
  std::string why = "connection to " + self->address_;
  if (std::string refused = why_refused(self->reply_budget_); !refused.empty()) {
    why += " dropped: ";  // the reader refused a reply (it failed as out of memory)
    why += refused;
  } else {
    why += " lost";
    if (ac->errstr && ac->err) {
      why += ": ";
      why += ac->errstr;
    }
  }
  self->lost(why);
}

// What is held after the whole replies are read is the reply being read: one that grows past its
// bounds ends the connection.
void connection::after_read(redisAsyncContext* ac) {
  auto* self = static_cast<connection*>(ac->data);
  if (ac != self->ac_) return;
  if (std::string why = overlong_reply(*ac->c.reader); !why.empty()) {
    self->drop("connection to " + self->address_ + " dropped: " + why);
  }
}

void connection::on_time(redisAsyncContext* ac, void* reply_ptr, void*) {
  auto* self = static_cast<connection*>(ac->data);
  auto* r = static_cast<redisReply*>(reply_ptr);
  if (r == nullptr || ac != self->ac_) return;
  if (std::int64_t t = parse_time_reply(*r); t >= 0) self->events_.server_time(t);
}

void connection::on_handshake(redisAsyncContext* ac, void* reply_ptr, void* privdata) {
  auto* self = static_cast<connection*>(ac->data);
  auto* reply = static_cast<redisReply*>(reply_ptr);
  std::string_view step = static_cast<const char*>(privdata);
  if (reply == nullptr || ac != self->ac_ || self->closed_) return;
  if (reply->type == REDIS_REPLY_ERROR) {
    self->drop_soon(std::string(step) + " failed on " + self->address_ + ": " + std::string(reply->str, reply->len));
    return;
  }
  if (step == "PING") self->on_handshake_done();
}

}  // namespace sluice::detail
