// SPDX-License-Identifier: Apache-2.0
#include "sluice/dual_layer.hpp"

#include <gtest/gtest.h>

#include <chrono>

namespace sluice {
namespace {

using namespace std::chrono_literals;

constexpr time_point t0 = time_point(std::chrono::seconds(600));

dual_layer make(policy tenant, policy user) {
  auto d = dual_layer::create({.tenant = tenant, .user = user});
  EXPECT_TRUE(d.ok());
  return std::move(d).value();
}

decision acquire(dual_layer& d, time_point now, std::int64_t cost = 1) {
  auto r = d.try_acquire(now, cost);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? r.value() : decision{};
}

TEST(DualLayer, AdmittedChecksRecordInBothLayers) {
  dual_layer d = make(sliding_window_policy(10, 60s), sliding_window_policy(3, 60s));
  decision a = acquire(d, t0);
  EXPECT_TRUE(a.allowed);
  EXPECT_TRUE(a.dual_layer);
  EXPECT_EQ(a.tenant.remaining, 9);
  EXPECT_EQ(a.user.remaining, 2);
  EXPECT_EQ(a.remaining, 2);  // min(tenant, user)
  EXPECT_EQ(a.limit, 3);      // the binding layer's limit
  EXPECT_EQ(a.rejected_by, layer::none);
}

TEST(DualLayer, UserRefusalLeavesTenantUnchanged) {
  dual_layer d = make(sliding_window_policy(10, 60s), sliding_window_policy(3, 60s));
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(acquire(d, t0).allowed);
  for (int i = 0; i < 5; ++i) {
    decision r = acquire(d, t0 + 1s);
    EXPECT_FALSE(r.allowed);
    EXPECT_EQ(r.rejected_by, layer::user);
    EXPECT_EQ(r.tenant.remaining, 7);  // refusals took nothing from the tenant
    EXPECT_EQ(r.retry_after, 59s);
  }
}

TEST(DualLayer, TenantRefusalLeavesUserUnchanged) {
  dual_layer d = make(token_bucket_policy(per_second(1), 2), token_bucket_policy(per_second(10), 5));
  EXPECT_TRUE(acquire(d, t0).allowed);
  EXPECT_TRUE(acquire(d, t0).allowed);
  decision r = acquire(d, t0);
  EXPECT_FALSE(r.allowed);
  EXPECT_EQ(r.rejected_by, layer::tenant);
  EXPECT_EQ(r.user.remaining, 3);  // the user layer holds what the two admissions left
  EXPECT_EQ(r.retry_after, 1s);
  EXPECT_EQ(r.limit, 2);
}

TEST(DualLayer, AdmittedDecisionReportsTheBindingLayer) {
  dual_layer d = make(sliding_window_policy(5, 60s), sliding_window_policy(100, 60s));
  decision a = acquire(d, t0);
  EXPECT_TRUE(a.allowed);
  EXPECT_EQ(a.binding, layer::tenant);  // 4 left of 5 binds before 99 of 100
  EXPECT_EQ(a.limit, 5);
  EXPECT_EQ(a.remaining, 4);
  EXPECT_EQ(a.rejected_by, layer::none);
}

TEST(DualLayer, CombineLayers) {
  decision t{.allowed = true, .limit = 10, .remaining = 7, .reset_after = 5s};
  decision u{.allowed = false, .limit = 3, .remaining = 0, .retry_after = 2s, .reset_after = 9s};
  decision d = combine_layers(t, u);
  EXPECT_FALSE(d.allowed);
  EXPECT_TRUE(d.dual_layer);
  EXPECT_EQ(d.rejected_by, layer::user);
  EXPECT_EQ(d.binding, layer::user);
  EXPECT_EQ(d.limit, 3);
  EXPECT_EQ(d.remaining, 0);
  EXPECT_EQ(d.retry_after, 2s);
  EXPECT_EQ(d.reset_after, 9s);
  EXPECT_EQ(d.tenant.remaining, 7);
  t.allowed = false;
  t.retry_after = 4s;
  decision both = combine_layers(t, u);
  EXPECT_EQ(both.rejected_by, layer::tenant);
  EXPECT_EQ(both.retry_after, 4s);  // the longest wait of the refusing layers
}

TEST(DualLayer, MixedAlgorithmsAndCostErrors) {
  dual_layer d = make(fixed_window_policy(5, 10s), sliding_window_counter_policy(100, 10s));
  EXPECT_TRUE(acquire(d, t0, 5).allowed);
  EXPECT_EQ(acquire(d, t0, 1).rejected_by, layer::tenant);
  auto bad = d.try_acquire(t0, 6);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error(), errc::cost_exceeds_burst);
  EXPECT_NE(bad.error().message.find("tenant"), std::string::npos);
}

TEST(DualLayer, InvalidLayerIsNamed) {
  auto d = dual_layer::create({.tenant = sliding_window_policy(0, 1s), .user = sliding_window_policy(1, 1s)});
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.error().message.find("tenant layer"), std::string::npos);
}

}  // namespace
}  // namespace sluice
