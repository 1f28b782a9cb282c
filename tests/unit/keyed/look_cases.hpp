// SPDX-License-Identifier: Apache-2.0
// What a look (a check of cost 0) promises, checked on any backend (the memory backend's unit test,
// the Redis backend's and the Redis Cluster's integration tests run the same cases): it answers as a
// check of one unit would, reports what is left before that unit, and records nothing.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "sluice/backend.hpp"
#include "sluice/testing/simulated_clock.hpp"

namespace sluice::testing {

// `b` reads time from `clock`; nothing else uses rules named "look_*".
inline void expect_look_semantics(backend& b, simulated_clock& clock) {
  using namespace std::chrono_literals;
  const rule rules[] = {
      {.name = "look_tb", .limit = token_bucket_policy(per_second(1), 3)},
      {.name = "look_swl", .limit = sliding_window_policy(3, 10s)},
      {.name = "look_swc", .limit = sliding_window_counter_policy(3, 10s)},
      {.name = "look_fw", .limit = fixed_window_policy(3, 10s)},
      {.name = "look_dual",
       .limit = fixed_window_policy(5, 10s),
       .tenant = token_bucket_policy(per_second(1), 3)},
  };
  for (const rule& r : rules) {
    SCOPED_TRACE(r.name);
    auto p = b.prepare(r).value();
    check_request req{.rule = p.get(), .key = "k", .tenant = "t", .user = "u", .cost = 0};
    auto check = [&](std::int64_t cost) {
      check_request c = req;
      c.cost = cost;
      auto d = b.check(c);
      EXPECT_TRUE(d.ok()) << (d.ok() ? "" : d.error().message);
      return d.ok() ? d.value() : decision{};
    };

    // A key never seen: all of it left, and the look takes none of it.
    for (int i = 0; i < 5; ++i) {
      const decision fresh = check(0);
      EXPECT_TRUE(fresh.allowed);
      EXPECT_EQ(fresh.remaining, 3);
      EXPECT_EQ(fresh.retry_after, 0ns);
    }
    ASSERT_TRUE(check(2).allowed);
    const decision one_left = check(0);
    EXPECT_TRUE(one_left.allowed);
    EXPECT_EQ(one_left.remaining, 1) << "what is left before the unit it looked at";
    EXPECT_EQ(one_left.limit, 3);
    const decision last = check(1);
    EXPECT_TRUE(last.allowed) << "the look took nothing";
    EXPECT_EQ(last.remaining, 0);

    // Nothing left: refused as one unit would be, with the same wait; still nothing recorded.
    const decision refused = check(1);
    ASSERT_FALSE(refused.allowed);
    const decision looked_at = check(0);
    EXPECT_FALSE(looked_at.allowed);
    EXPECT_EQ(looked_at.remaining, 0);
    EXPECT_NEAR(std::chrono::duration<double>(looked_at.retry_after).count(),
                std::chrono::duration<double>(refused.retry_after).count(), 1e-6);
    if (r.is_dual_layer()) {
      EXPECT_EQ(looked_at.rejected_by, layer::tenant);
      EXPECT_EQ(looked_at.user.remaining, 2) << "the user's layer has 2 of 5 left, and the look took none";
    }

    // Once a unit is back, the look admits and the unit is still there to take.
    clock.advance(refused.retry_after);
    EXPECT_TRUE(check(0).allowed);
    EXPECT_TRUE(check(1).allowed);
    clock.advance(1min);  // every rule full again before the next
  }

  // A look is a check's own: check_all refuses it whole.
  auto p = b.prepare(rules[3]).value();
  const check_request look{.rule = p.get(), .key = "k", .cost = 0};
  EXPECT_FALSE(b.check_all({&look, 1}).ok());
}

}  // namespace sluice::testing
