// SPDX-License-Identifier: Apache-2.0
// tests/unit/redis/fake_connection.hpp — a node's connection (node.hpp) without a server: it keeps
// what the node sends, in order, and answers from RESP bytes the test feeds it, read by hiredis's
// reader as the real connection reads them; the test plays the connection's events (handshake,
// loss).
//
//   std::shared_ptr<fake_connection> wire;
//   auto n = std::make_shared<node>(context, fake_connection::factory(wire, "10.0.0.1:6379"));
//   n->connect();
//   wire->handshake();              // TIME read, PING answered: the node is ready
//   n->send(op, false);             // wire->sent() holds its EVALSHA
//   wire->feed(":1\r\n");           // the oldest command waiting gets this reply
//
// test_checks makes the ops to send: checks of one rule, as the engine makes them.
//
// Not thread-safe: the test's thread, as the node's strand.
#pragma once

#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "redis/command.hpp"
#include "redis/connection.hpp"
#include "redis/node.hpp"

namespace sluice::detail {

class fake_connection final : public node_connection {
 public:
  fake_connection(connection::events e, std::string address)
      : events_(std::move(e)), address_(std::move(address)), where_(*parse_endpoint(address_)) {}
  ~fake_connection() override { redisReaderFree(reader_); }

  /// A node factory whose connection `out` then names.
  static node::connection_factory factory(std::shared_ptr<fake_connection>& out, std::string address) {
    return [&out, address](connection::events e) {
      out = std::make_shared<fake_connection>(std::move(e), address);
      return out;
    };
  }

  // --- as the node sees it ----------------------------------------------------------------------
  void connect() override {
    if (open_ || closed_) return;
    open_ = true;
    ++connects_;
    if (events_.opened) events_.opened();
  }
  bool resolving() const noexcept override { return false; }
  bool open() const noexcept override { return open_; }
  bool send(std::string_view resp, reply_fn fn, void* privdata) override {
    if (!open_) return false;
    sent_.emplace_back(resp);
    waiting_.push_back({fn, privdata});
    return true;
  }
  void drop_soon(const std::string& why) override { drops_.push_back(why); }
  void close() override {
    closed_ = true;
    answer_all_lost();
  }
  const std::string& address() const noexcept override { return address_; }
  const endpoint& where() const noexcept override { return where_; }

  // --- as the test plays the server ------------------------------------------------------------
  /// The handshake's TIME (server µs) read, then its PING answered.
  void handshake(std::int64_t server_us = 1'700'000'000'000'000) {
    events_.server_time(server_us);
    events_.ready();
  }
  /// The connection is gone: what waits gets a null reply, then the node hears why.
  void lose(const std::string& why) {
    answer_all_lost();
    events_.lost(why);
  }
  /// Bytes from the server, as they come: each whole reply answers the oldest command waiting.
  void feed(std::string_view bytes) {
    ASSERT_EQ(redisReaderFeed(reader_, bytes.data(), bytes.size()), REDIS_OK);
    for (;;) {
      void* reply = nullptr;
      ASSERT_EQ(redisReaderGetReply(reader_, &reply), REDIS_OK);
      if (reply == nullptr) return;
      ASSERT_FALSE(waiting_.empty()) << "a reply no command waits for";
      const auto [fn, privdata] = waiting_.front();
      waiting_.pop_front();
      if (fn != nullptr) fn(static_cast<redisReply*>(reply), privdata);
      freeReplyObject(reply);
    }
  }

  /// What the node sent, in order (RESP).
  const std::vector<std::string>& sent() const noexcept { return sent_; }
  /// Commands sent whose reply has not come.
  std::size_t waiting() const noexcept { return waiting_.size(); }
  const std::vector<std::string>& drops() const noexcept { return drops_; }
  int connects() const noexcept { return connects_; }
  bool closed() const noexcept { return closed_; }

 private:
  void answer_all_lost() {
    open_ = false;
    auto waiting = std::move(waiting_);
    waiting_.clear();
    for (const auto& [fn, privdata] : waiting) {
      if (fn != nullptr) fn(nullptr, privdata);
    }
  }

  struct awaited {
    reply_fn fn;
    void* privdata;
  };

  connection::events events_;
  std::string address_;
  endpoint where_;
  redisReader* reader_ = redisReaderCreate();
  std::vector<std::string> sent_;
  std::deque<awaited> waiting_;
  std::vector<std::string> drops_;
  int connects_ = 0;
  bool open_ = false;
  bool closed_ = false;
};

/// Checks of one token-bucket rule as the engine makes them, to send on a node.
class test_checks {
 public:
  test_checks() {
    auto call = prepare_script(rule_.definition());
    EXPECT_TRUE(call.ok());
    rule_.call = std::move(call).value();
  }
  op_ptr make(std::string key) {
    auto o = std::make_shared<op>();
    keys_.push_back(std::move(key));
    o->rule = &rule_;
    o->req = {.rule = &rule_, .key = keys_.back()};
    o->call = evalsha_command(rule_.call, rule_.definition(), o->req, "sluice:", -1, -1);
    o->deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    return o;
  }
  const prepared_script& call() const noexcept { return rule_.call; }

 private:
  redis_prepared_rule rule_{{.name = "api", .limit = token_bucket_policy(per_second(100), 10)}, nullptr};
  std::deque<std::string> keys_;
};

}  // namespace sluice::detail
