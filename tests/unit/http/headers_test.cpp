// SPDX-License-Identifier: Apache-2.0
#include "sluice/http/headers.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace sluice::http {
namespace {

using namespace std::chrono_literals;

std::map<std::string, std::string> as_map(const header_fields& fields) {
  std::map<std::string, std::string> m;
  for (const auto& f : fields) m.emplace(std::string(f.name), std::string(f.value));
  return m;
}

const auto wall = std::chrono::system_clock::time_point(std::chrono::seconds(1'700'000'000));

TEST(Headers, AdmittedCarriesLimitRemainingReset) {
  rule r{.name = "api", .limit = token_bucket_policy(per_second(5), 60)};
  decision d{.allowed = true, .limit = 60, .remaining = 59, .reset_after = 200ms};
  auto h = as_map(rate_limit_headers(d, r, wall, {}));
  EXPECT_EQ(h["X-RateLimit-Limit"], "60");
  EXPECT_EQ(h["X-RateLimit-Remaining"], "59");
  EXPECT_EQ(h["X-RateLimit-Reset"], "1700000001");  // rounded up to whole seconds
  EXPECT_EQ(h.count("Retry-After"), 0u);
  EXPECT_EQ(h.count("RateLimit"), 0u);
}

TEST(Headers, RefusedCarriesRetryAfterAtLeastOneSecond) {
  rule r{.name = "api", .limit = token_bucket_policy(per_second(5), 60)};
  decision d{.allowed = false, .limit = 60, .remaining = 0, .retry_after = 200ms, .reset_after = 12s};
  auto h = as_map(rate_limit_headers(d, r, wall, {}));
  EXPECT_EQ(h["Retry-After"], "1");
  d.retry_after = 2001ms;
  EXPECT_EQ(as_map(rate_limit_headers(d, r, wall, {}))["Retry-After"], "3");
  d.retry_after = never;
  EXPECT_EQ(as_map(rate_limit_headers(d, r, wall, {}))["Retry-After"], "86400");
}

TEST(Headers, IetfFields) {
  rule r{.name = "ai\"x", .limit = sliding_window_policy(100, 60s)};
  decision d{.allowed = true, .limit = 100, .remaining = 42, .reset_after = 30s};
  auto h = as_map(rate_limit_headers(d, r, wall, {.legacy_fields = false, .ietf_fields = true}));
  EXPECT_EQ(h["RateLimit-Policy"], "\"ai\\\"x\";q=100;w=60");
  EXPECT_EQ(h["RateLimit"], "\"ai\\\"x\";r=42;t=30");
  EXPECT_EQ(h.count("X-RateLimit-Limit"), 0u);
}

TEST(Headers, DualLayerShowsTheBindingLayersPolicy) {
  rule r{.name = "d", .limit = sliding_window_policy(100, 60s), .tenant = sliding_window_policy(5, 5s)};
  decision d{
      .allowed = true, .limit = 5, .remaining = 4, .reset_after = 5s, .dual_layer = true, .binding = layer::tenant};
  auto h = as_map(rate_limit_headers(d, r, wall, {.ietf_fields = true}));
  EXPECT_EQ(h["RateLimit-Policy"], "\"d\";q=5;w=5");
  d.binding = layer::user;
  d.limit = 100;
  EXPECT_EQ(as_map(rate_limit_headers(d, r, wall, {.ietf_fields = true}))["RateLimit-Policy"], "\"d\";q=100;w=60");
}

TEST(HeaderFields, HoldTheirTextThroughCopiesAndLongValues) {
  header_fields f;
  f.add("A", std::int64_t{-42});
  f.add("B", "two");
  const std::string long_value(300, 'x');  // past the inline text: all of it moves to the heap
  f.add("C", long_value);
  f.add("D", std::int64_t{1'700'000'001});
  header_fields copy = f;
  f = header_fields{};
  ASSERT_EQ(copy.size(), 4u);
  EXPECT_EQ(copy[0].name, "A");
  EXPECT_EQ(copy[0].value, "-42");
  EXPECT_EQ(copy[1].value, "two");
  EXPECT_EQ(copy[2].value, long_value);
  EXPECT_EQ(copy.at(3).value, "1700000001");
  EXPECT_THROW((void)copy.at(4), std::out_of_range);
  std::vector<std::string> names;
  for (const auto& h : copy) names.emplace_back(h.name);
  EXPECT_EQ(names, (std::vector<std::string>{"A", "B", "C", "D"}));
  copy.add("E", "");
  copy.add("F", std::int64_t{0});
  EXPECT_EQ(copy[4].value, "");
  EXPECT_EQ(copy[5].value, "0");
  EXPECT_THROW(copy.add("G", "seventh"), std::length_error);
  EXPECT_EQ(copy.size(), 6u);
}

TEST(Headers, LongRuleNamesInTheIetfFields) {
  rule r{.name = std::string(500, 'n'), .limit = sliding_window_policy(100, 60s)};
  decision d{.allowed = false, .limit = 100, .remaining = 0, .retry_after = 2s, .reset_after = 30s};
  auto h = as_map(rate_limit_headers(d, r, wall, {.ietf_fields = true}));
  EXPECT_EQ(h["RateLimit"], "\"" + r.name + "\";r=0;t=30");
  EXPECT_EQ(h["X-RateLimit-Reset"], "1700000030");
  EXPECT_EQ(h["Retry-After"], "2");
}

TEST(Headers, TokenBucketWindowIsTimeToRefill) {
  EXPECT_EQ(policy_window_seconds(token_bucket_policy(per_second(5), 60)), 12);
  EXPECT_EQ(policy_window_seconds(token_bucket_policy(per_second(0), 60)), 1);
  EXPECT_EQ(policy_window_seconds(sliding_window_policy(1, 250ms)), 1);
  EXPECT_EQ(ceil_seconds(-5s), 0);
}

}  // namespace
}  // namespace sluice::http
