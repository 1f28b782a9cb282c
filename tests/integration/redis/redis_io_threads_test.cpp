// SPDX-License-Identifier: Apache-2.0
// A Redis backend on several io_contexts (a server's io threads), against a real redis-server: each
// io thread has its own connection, a check asked on one is answered on that same thread, limits
// stay exact across them, and a leased rule keeps one lease table whichever thread checks it.
// Also runs under ThreadSanitizer (label `concurrency`).
#include <gtest/gtest.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <atomic>
#include <future>
#include <thread>

#include "integration/redis/redis_server.hpp"
#include "sluice/redis_backend.hpp"
#include "sluice/testing/simulated_clock.hpp"

namespace sluice {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using testing::redis_server;

// Two io_contexts, each run by its own thread until the end of the test.
class io_threads {
 public:
  io_threads() {
    for (auto& io : ios_) {
      guards_.emplace_back(io.get_executor());
      threads_.emplace_back([&io] { io.run(); });
    }
  }
  ~io_threads() { stop(); }
  void stop() {
    guards_.clear();
    for (auto& io : ios_) io.stop();
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  std::vector<asio::io_context*> list() { return {&ios_[0], &ios_[1]}; }
  asio::io_context& operator[](std::size_t i) { return ios_[i]; }

 private:
  asio::io_context ios_[2];
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> guards_;
  std::vector<std::thread> threads_;
};

struct tally {
  std::atomic<int> admitted{0}, refused{0}, failed{0}, elsewhere{0};
};

// `checks` async checks of `key` asked on `io`'s thread, at most 64 in flight; returns when all are
// answered. Counts answers that ran on another thread than the one that asked.
void check_from(asio::io_context& io, backend& b, const prepared_rule& rule, std::string key, int checks, tally& t) {
  std::promise<void> done;
  asio::post(io, [&] {
    struct loop : std::enable_shared_from_this<loop> {
      asio::io_context* io;
      backend* b;
      const prepared_rule* rule;
      std::string key;
      int left;
      int in_flight = 0;
      tally* t;
      std::promise<void>* done;
      std::thread::id asking = std::this_thread::get_id();
      void next() {
        while (left > 0 && in_flight < 64) {
          --left;
          ++in_flight;
          check_request req{.rule = rule};
          req.key = key;
          b->async_check(req, [self = shared_from_this()](result<decision> d) { self->answered(d); });
        }
      }
      void answered(const result<decision>& d) {
        (!d ? t->failed : d->allowed ? t->admitted : t->refused).fetch_add(1);
        if (std::this_thread::get_id() == asking) return settle();
        // A leased rule's calls are answered on the first io thread: back to the asking one.
        t->elsewhere.fetch_add(1);
        asio::post(*io, [self = shared_from_this()] { self->settle(); });
      }
      void settle() {
        --in_flight;
        if (left == 0 && in_flight == 0) return done->set_value();
        // Posted: answers from a lease come inline, and would nest a call per check.
        if (in_flight == 0) asio::post(*io, [self = shared_from_this()] { self->next(); });
      }
    };
    auto l = std::make_shared<loop>();
    l->io = &io;
    l->b = &b;
    l->rule = &rule;
    l->key = key;
    l->left = checks;
    l->t = &t;
    l->done = &done;
    l->next();
  });
  done.get_future().wait();
}

// `checks` checks of `key` asked on each of the two io threads at once.
void check_from_both(io_threads& threads, backend& b, const prepared_rule& rule, const std::string& key, int checks,
                     tally& t) {
  std::thread second([&] { check_from(threads[1], b, rule, key, checks, t); });
  check_from(threads[0], b, rule, key, checks, t);
  second.join();
}

int client_connections(redis_server& redis) {
  auto r = redis.command({"CLIENT", "LIST"});
  std::string list(r->str, r->len);
  return static_cast<int>(std::count(list.begin(), list.end(), '\n')) - 1;  // not the asking one
}

TEST(RedisIoThreadsTest, EachThreadHasItsConnectionAndItsAnswersAndTheLimitHoldsAcrossThem) {
  redis_server redis;
  io_threads threads;
  auto b = make_redis_backend({.addresses = {redis.address()}, .command_timeout = 5s}, threads.list());
  ASSERT_TRUE(b.ok()) << b.error().message;
  const rule r{.name = "api", .limit = sliding_window_policy(1000, std::chrono::hours(1))};
  auto p = (*b)->prepare(r);
  ASSERT_TRUE(p.ok());
  tally t;
  check_from_both(threads, **b, **p, "user:1", 1500, t);
  EXPECT_EQ(t.failed, 0);
  EXPECT_EQ(t.admitted, 1000);
  EXPECT_EQ(t.refused, 2000);
  EXPECT_EQ(t.elsewhere, 0) << "answers that changed thread";
  EXPECT_EQ(client_connections(redis), 2);
  EXPECT_EQ((*b)->stats().checks, 3000u);
  EXPECT_EQ((*b)->stats().redis_decisions, 3000u);
  EXPECT_TRUE((*b)->ready());

  // A blocking check on either io thread would wait for its own thread: refused there.
  for (std::size_t i = 0; i < 2; ++i) {
    std::promise<std::error_code> code;
    asio::post(threads[i], [&] {
      check_request req{.rule = p->get()};
      req.key = "user:2";
      auto d = (*b)->check(req);
      code.set_value(d ? std::error_code() : d.error().code);
    });
    EXPECT_EQ(code.get_future().get(), errc::invalid_argument) << "io thread " << i;
  }
  // Any other thread's checks go to the first io thread's connection.
  check_request req{.rule = p->get()};
  req.key = "user:2";
  auto d = (*b)->check(req);
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->allowed);
  b->reset();
  threads.stop();
}

TEST(RedisIoThreadsTest, ALeasedRuleIsOneTableWhicheverThreadChecksIt) {
  redis_server redis;
  io_threads threads;
  sluice::testing::simulated_clock clock{time_point(std::chrono::hours(24 * 365))};
  auto b = make_redis_backend({.addresses = {redis.address()}, .command_timeout = 5s, .clock_for_test = &clock},
                              threads.list());
  ASSERT_TRUE(b.ok()) << b.error().message;
  rule r{.name = "leased", .limit = fixed_window_policy(500, 60s)};
  r.lease = lease_policy{.period = 200ms, .max_share = 0.1};
  auto p = (*b)->prepare(r);
  ASSERT_TRUE(p.ok());
  tally t;
  check_from_both(threads, **b, **p, "hot", 2000, t);
  EXPECT_EQ(t.failed, 0);
  EXPECT_LE(t.admitted, 500);
  EXPECT_GE(t.admitted, 450) << "at most one lease's share unused";
  std::string metrics;
  (*b)->append_metrics(metrics);
  EXPECT_NE(metrics.find("sluice_lease_checks_total{rule=\"leased\"} 4000"), std::string::npos) << metrics;
  b->reset();
  threads.stop();
}

TEST(RedisIoThreadsTest, NoIoContextIsAnError) {
  auto b = make_redis_backend({.addresses = {"127.0.0.1:6379"}}, std::span<asio::io_context* const>{});
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.error().code, errc::invalid_argument);
  asio::io_context* const null[] = {nullptr};
  EXPECT_FALSE(make_redis_cluster_backend({.addresses = {"127.0.0.1:6379"}}, null).ok());
}

}  // namespace
}  // namespace sluice
