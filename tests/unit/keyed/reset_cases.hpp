// SPDX-License-Identifier: Apache-2.0
// What backend::reset promises, checked on any backend (the memory backend's unit test, the Redis
// backend's and the Redis Cluster's integration tests run the same cases): the key reset starts
// again full, no other key changes, a dual-layer reset names one layer, and a bad reset is refused.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "sluice/backend.hpp"
#include "sluice/testing/simulated_clock.hpp"

namespace sluice::testing {

// Nothing else uses rules named "reset_*".
inline void expect_reset_semantics(backend& b) {
  using namespace std::chrono_literals;
  auto admitted = [&](const prepared_rule& p, std::string_view key, std::int64_t cost = 1) {
    auto d = b.check({.rule = &p, .key = key, .cost = cost});
    EXPECT_TRUE(d.ok()) << (d.ok() ? "" : d.error().message);
    return d.ok() && d->allowed;
  };
  for (const policy& limit : {token_bucket_policy(per_second(0.001), 3), sliding_window_policy(3, 1h),
                              sliding_window_counter_policy(3, 1h), fixed_window_policy(3, 1h)}) {
    const rule r{.name = "reset_" + std::string(to_string(limit.algorithm)), .limit = limit};
    SCOPED_TRACE(r.name);
    auto p = b.prepare(r).value();
    ASSERT_TRUE(admitted(*p, "spent", 3));
    ASSERT_TRUE(admitted(*p, "other", 3));
    ASSERT_FALSE(admitted(*p, "spent"));
    ASSERT_TRUE(b.reset({.rule = p.get(), .key = "spent"}).ok());
    EXPECT_TRUE(admitted(*p, "spent", 3)) << "full again";
    EXPECT_FALSE(admitted(*p, "other")) << "another key keeps what it used";
    EXPECT_TRUE(b.reset({.rule = p.get(), .key = "never-seen"}).ok()) << "a key never seen is already full";
  }

  // An override's rule resets the key its base rule checks.
  const rule base{.name = "reset_override", .limit = fixed_window_policy(2, 1h)};
  auto p = b.prepare(base).value();
  rule bigger = base;
  bigger.limit.limit = 4;
  auto over = b.prepare_override(bigger, *p).value();
  ASSERT_TRUE(admitted(*over, "vip", 4));
  ASSERT_TRUE(b.reset({.rule = p.get(), .key = "vip"}).ok());
  EXPECT_TRUE(admitted(*over, "vip", 4));

  // Dual layer: a user's reset leaves the tenant's layer; the tenant's leaves its users'.
  const rule dual{
      .name = "reset_dual", .limit = fixed_window_policy(2, 1h), .tenant = token_bucket_policy(per_second(0.001), 3)};
  auto d = b.prepare(dual).value();
  auto check_dual = [&](std::string_view user) {
    auto r = b.check({.rule = d.get(), .tenant = "acme", .user = user});
    EXPECT_TRUE(r.ok());
    return r.ok() ? *r : decision{};
  };
  ASSERT_TRUE(check_dual("ann").allowed);
  ASSERT_TRUE(check_dual("ann").allowed);
  ASSERT_EQ(check_dual("ann").rejected_by, layer::user);
  ASSERT_TRUE(b.reset({.rule = d.get(), .tenant = "acme", .user = "ann"}).ok());
  ASSERT_TRUE(check_dual("ann").allowed) << "the user's layer full again; the tenant's third unit";
  ASSERT_EQ(check_dual("bob").rejected_by, layer::tenant);
  ASSERT_TRUE(b.reset({.rule = d.get(), .tenant = "acme"}).ok());
  EXPECT_TRUE(check_dual("bob").allowed) << "the tenant's layer full again";
  EXPECT_TRUE(check_dual("ann").allowed);
  EXPECT_EQ(check_dual("ann").rejected_by, layer::user) << "ann's layer kept what she used since her reset";

  // Bad resets are refused and change nothing.
  EXPECT_FALSE(b.reset({.rule = nullptr, .key = "k"}).ok());
  EXPECT_FALSE(b.reset({.rule = p.get()}).ok());
  EXPECT_FALSE(b.reset({.rule = p.get(), .key = std::string(max_key_length + 1, 'k')}).ok());
  EXPECT_FALSE(b.reset({.rule = d.get(), .user = "ann"}).ok()) << "a dual-layer reset names its tenant";
  EXPECT_EQ(check_dual("ann").rejected_by, layer::user);
}

}  // namespace sluice::testing
