// SPDX-License-Identifier: Apache-2.0
#include "sluice/keyed.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

namespace sluice {
namespace {

using namespace std::chrono_literals;

constexpr time_point t0 = time_point(std::chrono::seconds(600));

std::unique_ptr<keyed_limiter> make(policy p, std::size_t max_keys = 1'000'000) {
  auto k = keyed_limiter::create({.policy = p, .max_keys = max_keys});
  EXPECT_TRUE(k.ok()) << (k.ok() ? "" : k.error().message);
  return std::move(k).value();
}

decision acquire(keyed_limiter& k, std::string_view key, time_point now, std::int64_t cost = 1) {
  auto d = k.try_acquire(key, now, cost);
  EXPECT_TRUE(d.ok()) << (d.ok() ? "" : d.error().message);
  return d.ok() ? d.value() : decision{};
}

TEST(KeyedLimiter, EachKeyHasItsOwnLimiter) {
  auto k = make(token_bucket_policy(per_second(5), 60));
  for (int i = 0; i < 60; ++i) EXPECT_TRUE(acquire(*k, "user:a", t0).allowed);
  EXPECT_FALSE(acquire(*k, "user:a", t0).allowed);
  EXPECT_TRUE(acquire(*k, "user:b", t0).allowed);  // b is unaffected by a
  EXPECT_EQ(k->size(), 2u);
}

TEST(KeyedLimiter, LongAndBinaryKeysAreDistinct) {
  auto k = make(sliding_window_policy(1, 10s));
  const std::string long_a(400, 'a');
  std::string long_b = long_a;
  long_b.back() = 'b';
  const std::string binary("\0\xff\x01", 3);
  for (const std::string& key :
       {long_a, long_b, binary, std::string("a"), std::string(15, 'x'), std::string(16, 'x')}) {
    EXPECT_TRUE(acquire(*k, key, t0).allowed) << key.size();
    EXPECT_FALSE(acquire(*k, key, t0).allowed) << key.size();
  }
  EXPECT_EQ(k->size(), 6u);
}

TEST(KeyedLimiter, BadKeysAreErrorsThatChangeNothing) {
  auto k = make(token_bucket_policy(per_second(1), 1));
  EXPECT_EQ(k->try_acquire("", t0).error(), errc::invalid_argument);
  EXPECT_EQ(k->try_acquire(std::string(max_key_length + 1, 'k'), t0).error(), errc::key_too_long);
  EXPECT_TRUE(k->try_acquire(std::string(max_key_length, 'k'), t0).ok());
  EXPECT_EQ(k->try_acquire("x", t0, 2).error(), errc::cost_exceeds_burst);
  EXPECT_EQ(k->size(), 1u);
}

TEST(KeyedLimiter, IdleEntriesAreDroppedWithoutChangingDecisions) {
  auto k = make(token_bucket_policy(per_second(10), 2));
  for (int i = 0; i < 1000; ++i) EXPECT_TRUE(acquire(*k, "k" + std::to_string(i), t0).allowed);
  EXPECT_TRUE(acquire(*k, "busy", t0).allowed);
  EXPECT_TRUE(acquire(*k, "busy", t0).allowed);
  EXPECT_EQ(k->size(), 1001u);
  // 150 ms later every bucket that took one token is full again (idle ≥ cost / r); "busy" is not.
  k->sweep(t0 + 150ms);
  EXPECT_EQ(k->size(), 1u);
  // Its state survived the sweep: 1.5 tokens refilled, so one admission, not two.
  EXPECT_TRUE(acquire(*k, "busy", t0 + 150ms).allowed);
  EXPECT_FALSE(acquire(*k, "busy", t0 + 150ms).allowed);
}

TEST(KeyedLimiter, CapBoundsKeysAndEvictsIdleFirst) {
  constexpr std::size_t cap = 100;
  auto k = make(sliding_window_policy(1, 10s), cap);
  // 50 keys that will be idle later, then 50 that are busy (admitted later).
  for (int i = 0; i < 50; ++i) EXPECT_TRUE(acquire(*k, "old" + std::to_string(i), t0).allowed);
  for (int i = 0; i < 50; ++i) EXPECT_TRUE(acquire(*k, "busy" + std::to_string(i), t0 + 5s).allowed);
  EXPECT_EQ(k->size(), cap);
  // At t0 + 12 s the old keys are idle, the busy ones not: 50 new keys displace only idle entries.
  for (int i = 0; i < 50; ++i) EXPECT_TRUE(acquire(*k, "new" + std::to_string(i), t0 + 12s).allowed);
  EXPECT_LE(k->size(), cap);
  for (int i = 0; i < 50; ++i) EXPECT_FALSE(acquire(*k, "busy" + std::to_string(i), t0 + 12s).allowed) << i;
}

TEST(KeyedLimiter, KeyFloodAtTheCapNeverExceedsIt) {
  constexpr std::size_t cap = 1000;
  auto k = make(token_bucket_policy(per_second(1), 10), cap);
  for (int i = 0; i < 50'000; ++i) EXPECT_TRUE(acquire(*k, "flood:" + std::to_string(i), t0).allowed);
  EXPECT_LE(k->size(), cap);
  EXPECT_LT(k->memory_bytes(), cap * 200);
}

// Under a flood of new keys at the cap, the entry dropped is the one using the least of its
// capacity: a flood key, not the user at their limit (whose debt would be forgiven).
TEST(KeyedLimiter, KeyFloodDoesNotForgiveAUserAtTheLimit) {
  auto k = make(sliding_window_policy(100, 60s), 64);
  ASSERT_TRUE(k->try_acquire("user", t0, 100)->allowed);
  for (int i = 0; i < 5000; ++i) ASSERT_TRUE(k->try_acquire("flood:" + std::to_string(i), t0 + 1s)->allowed);
  EXPECT_FALSE(k->try_acquire("user", t0 + 2s)->allowed) << "the user's 100 of 100 are remembered";
  EXPECT_LE(k->size(), 64u);
  const key_cap_stats s = k->stats();
  EXPECT_GT(s.evicted_active, 4000u);
  EXPECT_EQ(s.refused, 0u);
}

TEST(KeyedLimiter, WhenFullRefuseRefusesNewKeysUntilOneIsIdle) {
  auto made =
      keyed_limiter::create({.policy = sliding_window_policy(1, 10s), .max_keys = 16, .when_full = when_full::refuse});
  ASSERT_TRUE(made.ok());
  auto& k = **made;
  for (int i = 0; i < 16; ++i) ASSERT_TRUE(k.try_acquire("k" + std::to_string(i), t0)->allowed);
  auto refused = k.try_acquire("new", t0 + 1s);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, errc::capacity_exhausted);
  EXPECT_FALSE(k.try_acquire("k3", t0 + 1s)->allowed) << "known keys keep their state";
  EXPECT_EQ(k.stats().refused, 1u);
  // Once the window has passed the old entries are idle: dropping one forgets nothing.
  EXPECT_TRUE(k.try_acquire("new", t0 + 11s)->allowed);
  EXPECT_EQ(k.stats().evicted_active, 0u);
}

TEST(KeyedLimiter, DualLayerAcrossKeys) {
  auto tenants = make(sliding_window_policy(5, 60s));
  auto users = make(sliding_window_policy(3, 60s));
  auto check = [&](std::string_view tenant, std::string_view user) {
    return keyed_limiter::try_acquire_dual(*tenants, tenant, *users, user, t0).value();
  };
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(check("acme", "alice").allowed);
  decision refused = check("acme", "alice");
  EXPECT_EQ(refused.rejected_by, layer::user);
  EXPECT_EQ(refused.tenant.remaining, 2);
  EXPECT_TRUE(check("acme", "bob").allowed);
  EXPECT_TRUE(check("acme", "bob").allowed);
  decision tenant_full = check("acme", "carol");
  EXPECT_EQ(tenant_full.rejected_by, layer::tenant);
  EXPECT_EQ(tenant_full.user.remaining, 3);      // carol's own layer untouched
  EXPECT_TRUE(check("other", "alice").allowed);  // another tenant, another alice
  // (tenant, user) pairs cannot collide by concatenation.
  EXPECT_TRUE(check("ab", "c").allowed);
  EXPECT_EQ(check("a", "bc").user.remaining, 2);
}

TEST(KeyedLimiter, DualLayerRejectsTheSameLimiterTwice) {
  auto k = make(sliding_window_policy(5, 60s));
  EXPECT_EQ(keyed_limiter::try_acquire_dual(*k, "t", *k, "u", t0).error(), errc::invalid_argument);
}

TEST(KeyedLimiter, MemoryPerTokenBucketKeyIsBounded) {
  auto k = make(token_bucket_policy(per_second(1), 10));
  constexpr int n = 100'000;
  for (int i = 0; i < n; ++i) EXPECT_TRUE(acquire(*k, "u" + std::to_string(i), t0).allowed);
  EXPECT_LE(k->memory_bytes() / n, 64u);
}

}  // namespace
}  // namespace sluice

#include "keyed/siphash.hpp"

namespace sluice::detail {
namespace {

// The reference vectors of SipHash-2-4 (key 00..0f, messages 00, 00 01, ...): the implementation the
// keyed tables run with 1-3 rounds is the same code.
TEST(SipHash, ReferenceVectors) {
  const sip_key key{0x0706050403020100ULL, 0x0f0e0d0c0b0a0908ULL};
  std::string message;
  for (int i = 0; i < 15; ++i) message += static_cast<char>(i);
  EXPECT_EQ((siphash<2, 4>(key, "")), 0x726fdb47dd0e0e31ULL);
  EXPECT_EQ((siphash<2, 4>(key, std::string_view(message.data(), 8))), 0x93f5f5799a932462ULL);
  EXPECT_EQ((siphash<2, 4>(key, message)), 0xa129ca6149be45e5ULL);
}

// Each table's hash (keyed_hash: the lease tables' maps) has a secret key of its own: keys that
// collide in one table's hash do not in another's, and none can be found in advance. (Two random
// keys hash one string alike by chance with odds of 2^-64.)
TEST(SipHash, EachTableHashesWithItsOwnKey) {
  const keyed_hash a, b;
  int same = 0;
  for (std::string_view k : {"tenant:acme", "user:1", ""}) same += a(k) == b(k);
  EXPECT_EQ(same, 0);
  EXPECT_EQ(a("user:1"), a(std::string("user:1"))) << "one table's hash is a function of the key";
}

// A limit changed at run time keeps what each key used: windows keep their counts under the new
// limit, a token bucket keeps its tokens (x/time/rate's SetLimit/SetBurst).
TEST(KeyedLimiter, RetunedWindowKeepsItsCounts) {
  auto k = make(fixed_window_policy(5, 60s));
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(acquire(*k, "u", t0).allowed);
  auto raised = keyed_limiter::retuned(*k, fixed_window_policy(10, 60s), t0);
  ASSERT_TRUE(raised.ok()) << raised.error().message;
  decision d = acquire(**raised, "u", t0);
  EXPECT_EQ(d.limit, 10);
  EXPECT_EQ(d.remaining, 6) << "a raised limit raises remaining at once";
  auto lowered = keyed_limiter::retuned(**raised, fixed_window_policy(2, 60s), t0);
  ASSERT_TRUE(lowered.ok());
  EXPECT_FALSE(acquire(**lowered, "u", t0).allowed) << "a lowered limit forgives nothing";
  EXPECT_TRUE(acquire(**lowered, "new", t0).allowed);
  EXPECT_EQ((*lowered)->size(), 2u);
  EXPECT_EQ(k->size(), 2u) << "one set of keys, shared";
}

TEST(KeyedLimiter, RetunedBucketKeepsItsTokens) {
  auto k = make(token_bucket_policy(per_second(1), 10));
  EXPECT_TRUE(acquire(*k, "u", t0, 6).allowed);  // 4 tokens left
  auto faster = keyed_limiter::retuned(*k, token_bucket_policy(per_second(2), 10), t0);
  ASSERT_TRUE(faster.ok());
  EXPECT_TRUE(acquire(**faster, "u", t0, 4).allowed);
  EXPECT_FALSE(acquire(**faster, "u", t0).allowed);
  EXPECT_TRUE(acquire(**faster, "u", t0 + 500ms).allowed) << "refilled at the new rate";
  // 0 tokens; 1 s later at 2/s: 2 tokens. A smaller burst caps them; a full bucket stays full.
  auto small = keyed_limiter::retuned(**faster, token_bucket_policy(per_second(2), 1), t0 + 1500ms);
  ASSERT_TRUE(small.ok());
  EXPECT_TRUE(acquire(**small, "u", t0 + 1500ms).allowed);
  EXPECT_FALSE(acquire(**small, "u", t0 + 1500ms).allowed);
  EXPECT_TRUE(acquire(*k, "full", t0).allowed);  // one of 10 used, refilled by t0 + 2 s
  auto bigger = keyed_limiter::retuned(**small, token_bucket_policy(per_second(2), 50), t0 + 2s);
  ASSERT_TRUE(bigger.ok());
  EXPECT_TRUE(acquire(**bigger, "full", t0 + 2s, 50).allowed);
}

TEST(KeyedLimiter, RetuneKeepsAlgorithmAndWindow) {
  auto k = make(fixed_window_policy(5, 60s));
  EXPECT_FALSE(keyed_limiter::retuned(*k, fixed_window_policy(5, 30s), t0).ok());
  EXPECT_FALSE(keyed_limiter::retuned(*k, sliding_window_policy(5, 60s), t0).ok());
  EXPECT_FALSE(keyed_limiter::retuned(*k, fixed_window_policy(0, 60s), t0).ok());
}

}  // namespace
}  // namespace sluice::detail
