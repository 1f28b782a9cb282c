// SPDX-License-Identifier: Apache-2.0
#include "redis/sentinel.hpp"

#include <hiredis/hiredis.h>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>
#include <charconv>

#include <spdlog/spdlog.h>

#include "core/log_value.hpp"

namespace sluice::detail {
namespace {

constexpr std::string_view switch_channel = "+switch-master";

std::string_view text_of(const redisReply& r) { return {r.str, r.len}; }

bool is_text(const redisReply* r) {
  return r != nullptr && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS);
}

// An address and a port as a sentinel spells them: an IPv4 or IPv6 address, or a host name
// (announce-hostnames).
std::optional<endpoint> endpoint_of(std::string_view host, std::string_view port) {
  if (host.empty() || host.size() > 255 || host.find_first_of(" \r\n[]") != std::string_view::npos) return std::nullopt;
  int p = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  if (ec != std::errc() || end != port.data() + port.size() || p < 1 || p > 65535) return std::nullopt;
  return endpoint{.host = std::string(host), .port = p};
}

}  // namespace

std::optional<endpoint> read_master_address(const redisReply& r, std::string& why) {
  if (r.type == REDIS_REPLY_NIL) {
    why = "does not know the master's name";
    return std::nullopt;
  }
  if (r.type == REDIS_REPLY_ERROR) {
    why = "answered " + std::string(text_of(r).substr(0, 200));
    return std::nullopt;
  }
  if (r.type == REDIS_REPLY_ARRAY && r.elements == 2 && is_text(r.element[0]) && is_text(r.element[1])) {
    if (auto e = endpoint_of(text_of(*r.element[0]), text_of(*r.element[1]))) return e;
  }
  why = "named no readable address";
  return std::nullopt;
}

std::optional<endpoint> read_switch_master(std::string_view payload, std::string_view master_name) {
  std::string_view field[5];
  for (auto& f : field) {
    const auto sp = payload.find(' ');
    f = payload.substr(0, sp);
    payload = sp == std::string_view::npos ? std::string_view() : payload.substr(sp + 1);
  }
  if (!payload.empty() || field[0] != master_name) return std::nullopt;
  return endpoint_of(field[3], field[4]);
}

struct sentinel_watch::ask_box {
  sentinel_watch* watch;
  std::size_t sentinel;
  std::uint64_t round;
};

sentinel_watch::sentinel_watch(const strand_type& strand, std::vector<endpoint> sentinels, const redis_options& o,
                               std::shared_ptr<const tls_settings> tls, master_fn on_master)
    : strand_(strand),
      sentinels_(std::move(sentinels)),
      options_(o),
      tls_(std::move(tls)),
      on_master_(std::move(on_master)),
      retry_timer_(strand),
      log_(o.error_log_interval),
      why_not_(sentinels_.size()) {
  for (std::size_t i = 0; i < sentinels_.size(); ++i) {
    // A failed connection shows as null replies to what was asked, and its reason, for the round's
    // log line, comes right after them. A sentinel named by a host name is asked once resolved.
    queries_.push_back(std::make_shared<connection>(
        strand_, sentinels_[i], options_, tls_,
        connection::events{.opened = [this, i] { on_query_opened(i); },
                           .ready = [] {},
                           .lost = [this, i](const std::string& why) { on_query_lost(i, why); },
                           .server_time = [](std::int64_t) {}},
        connection::peer::sentinel));
  }
}

void sentinel_watch::ask() {
  if (stopped_) return;
  if (asking_) {
    ask_again_ = true;
    return;
  }
  asking_ = true;
  ++round_;
  for (auto& w : why_not_) w.clear();
  ask_from(0);
}

// Asks sentinel i, or ends the round when none is left.
void sentinel_watch::ask_from(std::size_t i) {
  if (i == sentinels_.size()) return round_failed();
  connection& c = *queries_[i];
  c.connect();
  if (c.resolving()) {
    resolving_ = i;  // asked once its name resolves (on_query_opened), or passed over (on_query_lost)
    return;
  }
  send_query(i);
}

void sentinel_watch::send_query(std::size_t i) {
  auto* box = new ask_box{this, i, round_};
  if (!queries_[i]->send(resp_command({"SENTINEL", "get-master-addr-by-name", options_.master_name}), &on_answer,
                         box)) {
    delete box;
    ask_next(i);  // not inside connect(): its failure is told as `lost` first
  }
}

void sentinel_watch::ask_next(std::size_t i) {
  asio::post(strand_, [self = shared_from_this(), i, round = round_] {
    if (!self->stopped_ && round == self->round_) self->ask_from(i + 1);
  });
}

void sentinel_watch::on_query_opened(std::size_t i) {
  if (!asking_ || resolving_ != i) return;
  resolving_ = no_sentinel;
  send_query(i);
}

void sentinel_watch::on_query_lost(std::size_t i, const std::string& why) {
  why_not_[i] = why;
  if (!asking_ || resolving_ != i) return;  // what was asked is answered null: the round goes on there
  resolving_ = no_sentinel;
  ask_next(i);
}

void sentinel_watch::on_answer(redisReply* reply, void* privdata) {
  std::unique_ptr<ask_box> box(static_cast<ask_box*>(privdata));
  box->watch->answered(box->sentinel, box->round, reply);
}

void sentinel_watch::answered(std::size_t i, std::uint64_t round, const redisReply* reply) {
  if (stopped_ || round != round_) return;
  std::optional<endpoint> master;
  if (reply != nullptr) master = read_master_address(*reply, why_not_[i]);
  if (!master) return ask_next(i);  // after this one's connection has told why it went (a null reply)
  asking_ = false;
  if (subscriber_ == nullptr) subscribe(i);
  on_master_(*master);
  if (std::exchange(ask_again_, false)) ask();
}

void sentinel_watch::round_failed() {
  asking_ = false;
  ask_again_ = false;
  if (std::uint64_t count = log_.occurred()) {
    std::string why;
    for (std::size_t i = 0; i < sentinels_.size(); ++i) {
      if (!why.empty()) why += "; ";
      why += address_of(sentinels_[i]) + ": " + (why_not_[i].empty() ? "no answer" : why_not_[i]);
    }
    spdlog::warn("event=redis_no_master master_name={} error={} errors={}", log_value(options_.master_name),
                 log_value(why), count);
  }
  ask_later();
}

// On a connection of its own: a subscribed connection takes no other command. SUBSCRIBE goes as the
// connection is made (after its name resolves, for a host name).
void sentinel_watch::subscribe(std::size_t i) {
  subscriber_ = std::make_shared<connection>(
      strand_, sentinels_[i], options_, tls_,
      connection::events{.opened =
                             [this] {
                               subscriber_->send(resp_command({"SUBSCRIBE", switch_channel}), nullptr, nullptr);
                             },
                         .ready = [] {},
                         .lost =
                             [this](const std::string&) {
                               // A switch may pass unheard until another sentinel is subscribed to.
                               if (stopped_) return;
                               asio::post(strand_, [self = shared_from_this()] {
                                 if (self->stopped_) return;
                                 self->subscriber_->close();
                                 self->subscriber_ = nullptr;
                                 self->ask_later();
                               });
                             },
                         .server_time = [](std::int64_t) {},
                         .message = [this](const redisReply& m) { on_message(m); }},
      connection::peer::sentinel);
  subscriber_->connect();
}

// ["message", "+switch-master", "NAME OLD-IP OLD-PORT NEW-IP NEW-PORT"]
void sentinel_watch::on_message(const redisReply& m) {
  if (m.type != REDIS_REPLY_ARRAY || m.elements != 3) return;
  for (std::size_t k = 0; k < 3; ++k) {
    if (!is_text(m.element[k])) return;
  }
  if (text_of(*m.element[0]) != "message" || text_of(*m.element[1]) != switch_channel) return;
  if (auto master = read_switch_master(text_of(*m.element[2]), options_.master_name)) on_master_(*master);
}

void sentinel_watch::ask_later() {
  if (stopped_ || retry_armed_) return;
  retry_armed_ = true;
  retry_timer_.expires_after(options_.breaker_probe_interval);
  retry_timer_.async_wait(asio::bind_executor(strand_, [self = shared_from_this()](boost::system::error_code ec) {
    self->retry_armed_ = false;
    if (!ec) self->ask();
  }));
}

void sentinel_watch::stop() {
  if (stopped_) return;
  stopped_ = true;
  retry_timer_.cancel();
  for (auto& c : queries_) c->close();
  if (subscriber_) subscriber_->close();
}

}  // namespace sluice::detail
