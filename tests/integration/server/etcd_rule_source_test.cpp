// SPDX-License-Identifier: Apache-2.0
// Rules from a real etcd for a service that embeds sluice: sets delivered to a callback, the state
// of unchanged rules kept, a bad value rejected alone, the defaults while etcd is away.
#include "sluice/server/etcd_rule_source.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "integration/etcd/etcd_server.hpp"
#include "sluice/memory_backend.hpp"
#include "sluice/testing/simulated_clock.hpp"

namespace sluice::server {
namespace {

using namespace std::chrono_literals;

class EtcdRuleSource : public ::testing::Test {
 protected:
  // Waits (at most 20 s) until the latest delivered set satisfies `pred`.
  template <class Pred>
  std::shared_ptr<const rule_set> wait_for(Pred pred) {
    std::unique_lock lock(mu_);
    const bool ok = delivered_.wait_for(lock, 20s, [&] { return latest_ && pred(*latest_); });
    EXPECT_TRUE(ok) << "no rule set as expected was delivered";
    return latest_;
  }

  etcd_rule_source::callback collect() {
    return [this](std::shared_ptr<const rule_set> s) {
      std::lock_guard lock(mu_);
      latest_ = std::move(s);
      ++deliveries_;
      delivered_.notify_all();
    };
  }

  static std::int64_t limit_of(const rule_set& s, std::string_view name) {
    const prepared_rule* p = s.find(name);
    return p ? p->definition().limit.limit : -1;
  }

  testing::simulated_clock clock_{time_point(std::chrono::hours(1))};
  std::unique_ptr<memory_backend> backend_ = make_memory_backend({.clock = &clock_}).value();
  std::vector<rule> defaults_{{.name = "api", .limit = fixed_window_policy(2, 1h)}};
  std::mutex mu_;
  std::condition_variable delivered_;
  std::shared_ptr<const rule_set> latest_;
  int deliveries_ = 0;
};

TEST_F(EtcdRuleSource, DeliversTheDefaultsThenEtcdsRules) {
  sluice::testing::etcd_server etcd;
  auto source = etcd_rule_source::start({.enabled = true, .options = {.endpoints = {etcd.endpoint()}}}, *backend_,
                                        defaults_, collect());
  ASSERT_TRUE(source.ok()) << source.error().message;
  EXPECT_EQ(limit_of(*(*source)->current(), "api"), 2) << "the defaults, before etcd answers";
  // Two checks of the default rule, then etcd raises its limit: what was used is kept.
  auto check = [&](const rule_set& s) { return backend_->check({.rule = s.find("api"), .key = "k"}).value(); };
  EXPECT_TRUE(check(*(*source)->current()).allowed);
  EXPECT_TRUE(check(*(*source)->current()).allowed);
  etcd.put("/sluice/rules/api", R"({"algorithm":"fixed_window","limit":5,"window":"1h"})");
  auto raised = wait_for([](const rule_set& s) { return limit_of(s, "api") == 5; });
  decision d = check(*raised);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 2) << "5 - 2 used - this one";
  // A bad value is rejected alone; a good one beside it is taken.
  etcd.put("/sluice/rules/api", R"({"algorithm":"fixed_window","limit":-5,"window":"1h"})");
  etcd.put("/sluice/rules/extra", R"({"algorithm":"token_bucket","rate":1,"burst":3})");
  auto both = wait_for([](const rule_set& s) { return s.find("extra") != nullptr; });
  EXPECT_EQ(limit_of(*both, "api"), 5) << "the previous version stays";
  EXPECT_EQ((*source)->errors(), 1u);
  EXPECT_TRUE((*source)->status().connected);
  // Deleted: the default comes back.
  etcd.del("/sluice/rules/api");
  wait_for([](const rule_set& s) { return limit_of(s, "api") == 2; });
}

TEST_F(EtcdRuleSource, DefaultsWhileEtcdIsDownThenEtcdsRules) {
  sluice::testing::etcd_server etcd;
  etcd.put("/sluice/rules/api", R"({"algorithm":"fixed_window","limit":9,"window":"1h"})");
  etcd.kill();
  auto source = etcd_rule_source::start(
      {.enabled = true, .options = {.endpoints = {etcd.endpoint()}, .backoff_base = 50ms, .backoff_cap = 200ms}},
      *backend_, defaults_, collect());
  ASSERT_TRUE(source.ok()) << source.error().message;
  EXPECT_EQ(limit_of(*(*source)->current(), "api"), 2);
  EXPECT_FALSE((*source)->status().connected);
  etcd.restart();
  wait_for([](const rule_set& s) { return limit_of(s, "api") == 9; });
}

TEST_F(EtcdRuleSource, BadSettingsAndDefaultsAreErrors) {
  EXPECT_FALSE(
      etcd_rule_source::start({.enabled = true, .options = {.endpoints = {"no-port"}}}, *backend_, defaults_, collect())
          .ok());
  std::vector<rule> bad{{.name = "api", .limit = fixed_window_policy(0, 1h)}};
  EXPECT_FALSE(
      etcd_rule_source::start({.enabled = true, .options = {.endpoints = {"127.0.0.1:1"}}}, *backend_, bad, collect())
          .ok());
}

}  // namespace
}  // namespace sluice::server
