// SPDX-License-Identifier: Apache-2.0
#include "sluice/policy.hpp"

#include <gtest/gtest.h>

#include <chrono>

#include "sluice/backend.hpp"
#include "sluice/memory_backend.hpp"

namespace sluice {
namespace {

using namespace std::chrono_literals;

TEST(Policy, ValidationNamesTheParameter) {
  struct bad_case {
    policy p;
    const char* names;
  };
  const bad_case cases[] = {
      {token_bucket_policy(per_second(-1), 1), "rate"}, {token_bucket_policy(per_second(1), -1), "burst"},
      {sliding_window_policy(0, 1s), "limit"},          {sliding_window_policy(-5, 1s), "limit"},
      {sliding_window_policy(1, 0s), "window"},         {fixed_window_policy(1, -1s), "window"},
      {sliding_window_counter_policy(0, 1s), "limit"},
  };
  for (const auto& c : cases) {
    auto v = validate(c.p);
    ASSERT_FALSE(v.ok()) << c.names;
    EXPECT_EQ(v.error(), errc::invalid_argument);
    EXPECT_NE(v.error().message.find(c.names), std::string::npos) << v.error().message;
  }
  EXPECT_TRUE(validate(token_bucket_policy(per_second(0), 0)).ok());
  EXPECT_TRUE(validate(token_bucket_policy(rate::infinite(), 0)).ok());
}

TEST(Policy, AlgorithmNames) {
  EXPECT_EQ(algorithm_from_string("sliding_window"), algorithm::sliding_window_log);
  EXPECT_EQ(algorithm_from_string("token_bucket"), algorithm::token_bucket);
  EXPECT_EQ(algorithm_from_string("fixed_window"), algorithm::fixed_window);
  EXPECT_EQ(algorithm_from_string("leaky"), std::nullopt);
  EXPECT_EQ(to_string(algorithm::sliding_window_counter), "sliding_window_counter");
}

TEST(Policy, RatesFromDurations) {
  EXPECT_DOUBLE_EQ(every(200ms).per_second, 5.0);
  EXPECT_DOUBLE_EQ(per_minute(120).per_second, 2.0);
  EXPECT_TRUE(rate::infinite().is_infinite());
}

TEST(CheckRequest, Validation) {
  auto b = make_memory_backend({}).value();
  auto r = b->prepare({.name = "r", .limit = sliding_window_policy(10, 1s)}).value();
  EXPECT_TRUE(validate(check_request{.rule = r.get(), .key = "k"}, *b).ok());
  EXPECT_EQ(validate(check_request{.rule = r.get(), .key = "k", .cost = 11}, *b).error(), errc::cost_exceeds_burst);
  EXPECT_EQ(validate(check_request{.rule = r.get(), .key = "k", .cost = -1}, *b).error(), errc::invalid_argument);
  EXPECT_TRUE(validate(check_request{.rule = r.get(), .key = "k", .cost = 0}, *b).ok()) << "a look";
  EXPECT_EQ(validate(check_request{.rule = r.get(), .key = ""}, *b).error(), errc::invalid_argument);
  EXPECT_EQ(validate(check_request{.key = "k"}, *b).error(), errc::invalid_argument) << "no rule";
  auto other = make_memory_backend({}).value();
  EXPECT_EQ(validate(check_request{.rule = r.get(), .key = "k"}, *other).error(), errc::invalid_argument)
      << "a rule prepared by another backend";
  auto dual =
      b->prepare({.name = "d", .limit = sliding_window_policy(10, 1s), .tenant = sliding_window_policy(5, 1s)}).value();
  EXPECT_EQ(validate(check_request{.rule = dual.get(), .tenant = "t", .user = "u", .cost = 6}, *b).error(),
            errc::cost_exceeds_burst);
  EXPECT_EQ(validate(check_request{.rule = dual.get(), .user = "u"}, *b).error(), errc::invalid_argument);
  EXPECT_EQ(validate(check_request{.rule = dual.get(), .tenant = std::string(513, 't'), .user = "u"}, *b).error(),
            errc::key_too_long);
}

TEST(FullCapacityDecision, EveryLayerFullAndMarked) {
  const rule single{.name = "s", .limit = token_bucket_policy(per_second(1), 60)};
  decision d = full_capacity_decision(single, decision_source::disabled);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.limit, 60);
  EXPECT_EQ(d.remaining, 60);
  EXPECT_FALSE(d.dual_layer);
  EXPECT_EQ(d.source, decision_source::disabled);
  const rule dual{.name = "d",
                  .limit = sliding_window_policy(100, std::chrono::seconds(60)),
                  .tenant = sliding_window_policy(1000, std::chrono::seconds(60))};
  d = full_capacity_decision(dual, decision_source::fail_open);
  EXPECT_TRUE(d.dual_layer);
  EXPECT_EQ(d.tenant.remaining, 1000);
  EXPECT_EQ(d.user.remaining, 100);
  EXPECT_EQ(d.limit, 100);
  EXPECT_EQ(d.remaining, 100);
  EXPECT_EQ(d.source, decision_source::fail_open);
}

}  // namespace
}  // namespace sluice
