// SPDX-License-Identifier: Apache-2.0
#include "sluice/memory_backend.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "sluice/testing/simulated_clock.hpp"
#include "unit/keyed/check_all_cases.hpp"
#include "unit/keyed/look_cases.hpp"
#include "unit/keyed/reset_cases.hpp"

namespace sluice {
namespace {

using namespace std::chrono_literals;

class MemoryBackend : public ::testing::Test {
 protected:
  testing::simulated_clock clock_;
  std::unique_ptr<memory_backend> backend_ = make_memory_backend({.clock = &clock_, .max_keys_per_rule = 1000}).value();
  rule api_rule_{.name = "api", .limit = token_bucket_policy(per_second(5), 60)};
  prepared_rule_ptr api_ = backend_->prepare(api_rule_).value();
  prepared_rule_ptr tenant_api_ =
      backend_
          ->prepare(
              {.name = "tenant_api", .limit = sliding_window_policy(2, 60s), .tenant = sliding_window_policy(3, 60s)})
          .value();
};

// Bad options are refused with a message naming the option; nothing is silently replaced.
TEST(MemoryBackendFactory, RefusesBadOptions) {
  auto no_keys = make_memory_backend({.max_keys_per_rule = 0});
  ASSERT_FALSE(no_keys.ok());
  EXPECT_EQ(no_keys.error(), errc::invalid_argument);
  EXPECT_NE(no_keys.error().message.find("max_keys_per_rule must be >= 1"), std::string::npos)
      << no_keys.error().message;
  auto no_clock = make_memory_backend({.clock = nullptr});
  ASSERT_FALSE(no_clock.ok());
  EXPECT_EQ(no_clock.error(), errc::invalid_argument);
  EXPECT_NE(no_clock.error().message.find("clock must not be null"), std::string::npos) << no_clock.error().message;
  EXPECT_TRUE(make_memory_backend({}).ok());
  EXPECT_TRUE(make_memory_backend({.max_keys_per_rule = 1}).ok());
}

TEST_F(MemoryBackend, ChecksPerRuleAndKey) {
  for (int i = 0; i < 60; ++i) EXPECT_TRUE(backend_->check({.rule = api_.get(), .key = "user:1"}).value().allowed);
  decision d = backend_->check({.rule = api_.get(), .key = "user:1"}).value();
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after, 200ms);
  EXPECT_TRUE(backend_->check({.rule = api_.get(), .key = "user:2"}).value().allowed);
  auto other = backend_->prepare({.name = "other", .limit = api_rule_.limit}).value();
  EXPECT_TRUE(backend_->check({.rule = other.get(), .key = "user:1"}).value().allowed);
  EXPECT_EQ(backend_->key_count(), 3u);
}

TEST_F(MemoryBackend, CheckAllIsAllOrNothing) { testing::expect_check_all_semantics(*backend_, clock_); }

TEST_F(MemoryBackend, ALookAnswersAsOneUnitAndRecordsNothing) { testing::expect_look_semantics(*backend_, clock_); }

TEST_F(MemoryBackend, AResetKeyStartsAgainFull) { testing::expect_reset_semantics(*backend_); }

// Keys of one call in one shard of one table: each is made before any is read (making one may move
// the others), and all are decided under the one lock.
TEST_F(MemoryBackend, CheckAllOfManyKeysOfOneRule) {
  const rule r{.name = "many", .limit = fixed_window_policy(1, 60s)};
  auto p = backend_->prepare(r).value();
  std::vector<std::string> keys;
  for (int i = 0; i < 40; ++i) keys.push_back("key" + std::to_string(i));
  std::vector<check_request> checks;
  for (const auto& k : keys) checks.push_back({.rule = p.get(), .key = k});
  auto first = backend_->check_all(checks).value();
  for (const decision& d : first) EXPECT_TRUE(d.allowed);
  // One more new key beside the 40 spent ones: refused whole, and the new key keeps its unit.
  checks.push_back({.rule = p.get(), .key = "fresh"});
  auto second = backend_->check_all(checks).value();
  for (std::size_t i = 0; i + 1 < second.size(); ++i) EXPECT_FALSE(second[i].allowed);
  EXPECT_TRUE(second.back().allowed);
  EXPECT_TRUE(backend_->check({.rule = p.get(), .key = "fresh"}).value().allowed);
}

TEST_F(MemoryBackend, AsyncCheckCompletesWithTheSameDecision) {
  int calls = 0;
  backend_->async_check({.rule = api_.get(), .key = "k", .cost = 60}, [&](result<decision> d) {
    ++calls;
    EXPECT_TRUE(d.value().allowed);
  });
  backend_->async_check({.rule = api_.get(), .key = "k"}, [&](result<decision> d) {
    ++calls;
    EXPECT_FALSE(d.value().allowed);
  });
  EXPECT_EQ(calls, 2);
}

TEST_F(MemoryBackend, DualLayerRule) {
  EXPECT_TRUE(backend_->check({.rule = tenant_api_.get(), .tenant = "acme", .user = "a"}).value().allowed);
  EXPECT_TRUE(backend_->check({.rule = tenant_api_.get(), .tenant = "acme", .user = "a"}).value().allowed);
  decision user_full = backend_->check({.rule = tenant_api_.get(), .tenant = "acme", .user = "a"}).value();
  EXPECT_EQ(user_full.rejected_by, layer::user);
  EXPECT_TRUE(backend_->check({.rule = tenant_api_.get(), .tenant = "acme", .user = "b"}).value().allowed);
  decision tenant_full = backend_->check({.rule = tenant_api_.get(), .tenant = "acme", .user = "c"}).value();
  EXPECT_EQ(tenant_full.rejected_by, layer::tenant);
  EXPECT_EQ(tenant_full.tenant.limit, 3);
}

TEST_F(MemoryBackend, InvalidRequestsAreErrorsAndChangeNothing) {
  EXPECT_EQ(backend_->check({.rule = nullptr, .key = "k"}).error(), errc::invalid_argument);
  EXPECT_EQ(backend_->check({.rule = api_.get(), .key = ""}).error(), errc::invalid_argument);
  EXPECT_EQ(backend_->check({.rule = api_.get(), .key = "k", .cost = -1}).error(), errc::invalid_argument);
  EXPECT_EQ(backend_->check({.rule = api_.get(), .key = "k", .cost = 61}).error(), errc::cost_exceeds_burst);
  EXPECT_EQ(backend_->check({.rule = api_.get(), .key = std::string(600, 'k')}).error(), errc::key_too_long);
  EXPECT_EQ(backend_->check({.rule = tenant_api_.get(), .tenant = "acme"}).error(), errc::invalid_argument);
  EXPECT_EQ(backend_->prepare({.name = "bad", .limit = sliding_window_policy(0, 1s)}).error(), errc::invalid_argument);
  auto elsewhere = make_memory_backend({.clock = &clock_}).value()->prepare(api_rule_).value();
  EXPECT_EQ(backend_->check({.rule = elsewhere.get(), .key = "k"}).error(), errc::invalid_argument)
      << "a rule prepared by another backend";
  EXPECT_EQ(backend_->key_count(), 0u);
}

// A prepared rule holds its keys' state: the same definition prepared again starts afresh, and
// the state goes when the last holder drops it.
TEST_F(MemoryBackend, APreparedRuleHoldsItsKeysState) {
  for (int i = 0; i < 60; ++i) EXPECT_TRUE(backend_->check({.rule = api_.get(), .key = "k"}).value().allowed);
  EXPECT_FALSE(backend_->check({.rule = api_.get(), .key = "k"}).value().allowed);
  auto again = backend_->prepare(api_rule_).value();
  EXPECT_TRUE(backend_->check({.rule = again.get(), .key = "k"}).value().allowed);
  EXPECT_EQ(backend_->key_count(), 2u);
  api_.reset();
  EXPECT_EQ(backend_->key_count(), 1u);
  again.reset();
  EXPECT_EQ(backend_->key_count(), 0u);
  EXPECT_TRUE(backend_->ready());
}

}  // namespace
}  // namespace sluice
