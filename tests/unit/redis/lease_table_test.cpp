// SPDX-License-Identifier: Apache-2.0
// The lease table alone (no Redis): what a check does with a key's lease, how large a lease it asks
// for, when a token bucket's leased units may no longer be used, what is given back, and what a
// lease reply may not say. Time is passed in.
#include "redis/lease_table.hpp"

#include <gtest/gtest.h>

#include <thread>

#include "redis/scripts.hpp"
#include "sluice/gcra.hpp"
#include "unit/redis/reply_builder.hpp"

namespace sluice::detail {
namespace {

using namespace std::chrono_literals;
using step = lease_plan::step;

constexpr std::int64_t ms = 1'000'000;

rule leased(policy p, nanoseconds period = 200ms, double share = 0.25) {
  rule r{.name = "r", .limit = p};
  r.lease = lease_policy{.period = period, .max_share = share};
  return r;
}

lease_table make_table(const rule& r) {
  return lease_table(r, prepare_script(r).value(), 1000, std::make_shared<lease_counters>());
}

lease_waiter no_waiter() {
  return [](bool) {};
}

// A check; a refill it starts fails at once, so that the next check does not wait for it.
step check_step(lease_table& t, std::string_view key, std::int64_t now, std::int64_t cost = 1) {
  lease_plan p = t.check(key, cost, now, no_waiter);
  if (p.refill > 0) (void)t.failed(key);
  return p.what;
}

// A lease call's answer: granted `units` (0: refused, retry after `retry`), the check having used
// `used`, Redis's own remaining after it `shared` (the script reports it with the lease's units left).
lease_grant grant(std::int64_t sent, std::int64_t used, std::int64_t units, std::int64_t shared, std::int64_t valid_us,
                  std::string token = "7", nanoseconds retry = 0ns) {
  lease_grant g;
  g.sent_ns = sent;
  g.used = used;
  g.reply.units = units;
  g.reply.valid_us = valid_us;
  g.reply.token = std::move(token);
  g.reply.leased.allowed = units > 0;
  g.reply.leased.remaining = units > 0 ? shared + units - used : shared;
  g.reply.leased.retry_after = retry;
  g.reply.leased.reset_after = std::chrono::seconds(1);
  return g;
}

TEST(LeaseTableTest, AColdKeyAsksForItsCostAloneAndABusyOneForWhatItUsesInAPeriod) {
  lease_table t = make_table(leased(fixed_window_policy(1000, 60s)));
  lease_plan p = t.check("k", 1, 0, no_waiter);
  ASSERT_EQ(p.what, step::take);
  EXPECT_EQ(p.want, 1);
  t.answered("k", grant(0, 1, 1, 999, 60'000'000), 0);
  // Ten checks in this period, all asking Redis (each lease is one unit, used at once): the next
  // lease is as large as that demand.
  std::int64_t want = 0;
  for (int i = 0; i < 10; ++i) {
    p = t.check("k", 1, 1 + i, no_waiter);
    ASSERT_EQ(p.what, step::take);
    want = p.want;
    t.answered("k", grant(1 + i, 1, 1, 998 - i, 60'000'000), 1 + i);
  }
  EXPECT_EQ(want, 11);
  // Capped at max_share of the limit.
  for (int i = 0; i < 1000; ++i) (void)t.check("other", 1, 5, no_waiter), (void)t.failed("other");
  EXPECT_EQ(t.check("other", 1, 6, no_waiter).want, 250);
}

TEST(LeaseTableTest, LeasedUnitsStayWhileTheKeyIsBusyAndGoBackOnceItIsIdle) {
  lease_table t = make_table(leased(fixed_window_policy(100, 60s), 200ms));
  ASSERT_EQ(t.check("k", 1, 0, no_waiter).what, step::take);
  t.answered("k", grant(0, 1, 5, 90, 60'000'000), 0);  // 5 leased, 1 used by the check
  for (int i = 0; i < 4; ++i) {
    lease_plan p = t.check("k", 1, 10 * ms, no_waiter);
    ASSERT_EQ(p.what, step::admit) << i;
    EXPECT_EQ(p.leased.remaining, 90 + 3 - i);  // Redis's remaining and the lease's units left
    if (p.refill > 0) t.failed("k");
  }
  EXPECT_EQ(t.check("k", 1, 10 * ms, no_waiter).what, step::take);
  t.failed("k");
  t.answered("k", grant(20 * ms, 0, 3, 87, 60'000'000), 20 * ms);  // a refill
  // Checked at least once a period, the key keeps its lease.
  EXPECT_EQ(check_step(t, "k", 190 * ms), step::admit);
  EXPECT_TRUE(t.expire(380 * ms).empty());
  EXPECT_EQ(check_step(t, "k", 380 * ms), step::admit);
  // Unchecked for a period: what is left goes back, and the next check asks Redis.
  EXPECT_TRUE(t.expire(579 * ms).empty());
  std::vector<give_back> back = t.expire(580 * ms);
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].key, "k");
  EXPECT_EQ(back[0].units, 1);
  EXPECT_EQ(back[0].token, "7");
  EXPECT_TRUE(t.expire(581 * ms).empty());
  EXPECT_EQ(t.check("k", 1, 581 * ms, no_waiter).what, step::take);
}

TEST(LeaseTableTest, AWindowsLeaseEndsWithItsWindowAndIsNotGivenBackAfter) {
  lease_table t = make_table(leased(fixed_window_policy(100, 60s), 10s));
  ASSERT_EQ(t.check("k", 1, 0, no_waiter).what, step::take);
  t.answered("k", grant(0, 1, 10, 90, 50'000), 0);  // the window ends in 50 ms
  EXPECT_EQ(check_step(t, "k", 49 * ms), step::admit);
  EXPECT_EQ(t.check("k", 1, 50 * ms, no_waiter).what, step::take);
  t.failed("k");
  EXPECT_TRUE(t.expire(51 * ms).empty());  // a new window: giving back would not count
}

// A reply no script sends, whose units were valid until long ago: none of them is used here.
TEST(LeaseTableTest, UnitsValidForANegativeTimeAreNeverUsed) {
  for (const policy& p : {fixed_window_policy(100, 60s), token_bucket_policy(per_second(0.001), 100)}) {
    lease_table t = make_table(leased(p, 10s));
    ASSERT_EQ(t.check("k", 1, 0, no_waiter).what, step::take);
    t.answered("k", grant(0, 1, 10, 90, std::numeric_limits<std::int64_t>::min()), 0);
    EXPECT_EQ(t.check("k", 1, 0, no_waiter).what, step::take);
    t.failed("k");
  }
}

TEST(LeaseTableTest, ATokenBucketsLeasedUnitIsUsedOnlyBeforeItsSlotEnds) {
  // 100 per second: one slot is 10 ms. Leased: 5 units whose last slot ends 50 ms after the call.
  const rule r = leased(token_bucket_policy(per_second(100), 100), 1s, 0.5);
  lease_table t = make_table(r);
  ASSERT_EQ(t.check("k", 1, 0, no_waiter).what, step::take);
  t.answered("k", grant(0, 1, 5, 50, 50'000, "tat"), 0);
  // Slots end at 10, 20, 30, 40, 50 ms; the first was the check's. At 25 ms the second's has
  // passed: the third and fourth are left, then the fifth.
  EXPECT_EQ(check_step(t, "k", 25 * ms), step::admit);
  EXPECT_EQ(check_step(t, "k", 25 * ms), step::admit);
  EXPECT_EQ(check_step(t, "k", 41 * ms), step::admit);
  EXPECT_EQ(t.check("k", 1, 41 * ms, no_waiter).what, step::take);
  t.failed("k");
  // The hold: one period, at most max_units slots.
  EXPECT_EQ(t.hold_ns(), 50 * 10 * ms);
}

TEST(LeaseTableTest, ARefusalIsRememberedForItsCostUntilItsRetryAfter) {
  lease_table t = make_table(leased(fixed_window_policy(10, 60s)));
  ASSERT_EQ(t.check("k", 2, 0, no_waiter).what, step::take);
  t.answered("k", grant(0, 2, 0, 1, 0, "", 5s), ms);
  lease_plan p = t.check("k", 2, 2 * ms, no_waiter);
  ASSERT_EQ(p.what, step::refuse);
  EXPECT_FALSE(p.leased.allowed);
  EXPECT_EQ(p.leased.retry_after, 5s - 2ms);
  EXPECT_EQ(p.leased.remaining, 1);
  EXPECT_EQ(t.check("k", 3, 2 * ms, no_waiter).what, step::refuse);
  EXPECT_EQ(t.check("k", 1, 2 * ms, no_waiter).what, step::take);  // a smaller cost may fit
  t.failed("k");
  EXPECT_EQ(t.check("k", 2, 5000 * ms, no_waiter).what, step::take);
}

TEST(LeaseTableTest, ChecksWaitForTheLeaseInFlightAndResumeWhenItIsAnswered) {
  lease_table t = make_table(leased(fixed_window_policy(100, 60s)));
  ASSERT_EQ(t.check("k", 1, 0, no_waiter).what, step::take);
  int resumed = 0, failed = 0;
  const auto waiter = [&]() -> lease_waiter { return [&](bool f) { f ? ++failed : ++resumed; }; };
  for (int i = 0; i < 3; ++i) EXPECT_EQ(t.check("k", 1, 0, waiter).what, step::wait);
  for (lease_waiter& w : t.answered("k", grant(0, 1, 4, 90, 60'000'000), 0)) w(false);
  EXPECT_EQ(resumed, 3);
  ASSERT_EQ(t.check("k", 1, 0, no_waiter).what, step::admit);  // (each resumed check would take one)
  // A failed call fails its waiters too: they do not each wait for a call of their own.
  for (int i = 0; i < 5; ++i) (void)t.check("k", 1, 0, waiter);
  for (lease_waiter& w : t.failed("k")) w(true);
  EXPECT_EQ(failed, 3);  // two were admitted from the units left
}

TEST(LeaseTableTest, AResumedCheckAsksByItselfRatherThanWaitAgain) {
  lease_table t = make_table(leased(fixed_window_policy(100, 60s)));
  ASSERT_EQ(t.check("k", 1, 0, no_waiter).what, step::take);
  EXPECT_EQ(t.check("k", 1, 0, no_waiter).what, step::wait);
  EXPECT_EQ(t.check("k", 1, 0, no_waiter, true).what, step::exact);  // it waited once already
  t.failed("k");
}

TEST(LeaseTableTest, ALeaseEndsAThousandthBeforeItsWindowAsRedisMeasuredIt) {
  // Redis said the window ends 100 ms after the call: this instance's clock may run a little slow.
  lease_table t = make_table(leased(fixed_window_policy(100, 1h), 10s));
  ASSERT_EQ(t.check("k", 1, 0, no_waiter).what, step::take);
  t.answered("k", grant(0, 1, 50, 40, 100'000), 0);
  EXPECT_EQ(check_step(t, "k", 99'899'999), step::admit);
  EXPECT_EQ(t.check("k", 1, 99'900'000, no_waiter).what, step::take);
  t.failed("k");
}

TEST(LeaseTableTest, ARefusalForEverDoesNotKeepAnIdleKey) {
  lease_table t = make_table(leased(token_bucket_policy(per_second(1), 0)));
  ASSERT_EQ(t.check("k", 1, 0, no_waiter).what, step::take);
  t.answered("k", grant(0, 1, 0, 0, 0, "", never), 0);
  EXPECT_EQ(t.check("k", 1, ms, no_waiter).what, step::refuse);
  (void)t.expire(1000 * ms);  // idle for two periods: dropped, refusal and all
  EXPECT_EQ(t.check("k", 1, 1001 * ms, no_waiter).what, step::take);
  t.failed("k");
}

TEST(LeaseTableTest, UndoPutsBackUnitsOnlyWhileTheyAreStillTheNextOnes) {
  lease_table windows = make_table(leased(fixed_window_policy(100, 60s)));
  (void)windows.check("k", 1, 0, no_waiter);
  windows.answered("k", grant(0, 1, 3, 90, 60'000'000), 0);
  lease_plan a = windows.check("k", 1, 1, no_waiter);
  lease_plan b = windows.check("k", 1, 1, no_waiter);
  ASSERT_EQ(b.what, step::admit);
  if (a.refill > 0 || b.refill > 0) windows.failed("k");
  windows.undo("k", a.reservation, 2);  // a window's units are alike: back in any order
  EXPECT_EQ(windows.check("k", 1, 3, no_waiter).what, step::admit);

  lease_table bucket = make_table(leased(token_bucket_policy(per_second(100), 100), 1s, 0.5));
  (void)bucket.check("k", 1, 0, no_waiter);
  bucket.answered("k", grant(0, 1, 3, 50, 500'000, "tat"), 0);
  a = bucket.check("k", 1, 1, no_waiter);
  b = bucket.check("k", 1, 1, no_waiter);
  if (a.refill > 0 || b.refill > 0) bucket.failed("k");
  bucket.undo("k", a.reservation, 2);  // a later slot was taken since: not put back
  EXPECT_EQ(bucket.check("k", 1, 3, no_waiter).what, step::take);
  bucket.failed("k");
  bucket.undo("k", b.reservation, 4);  // the last one taken: back
  EXPECT_EQ(bucket.check("k", 1, 5, no_waiter).what, step::admit);
}

TEST(LeaseTableTest, ABusyKeyRefillsBeforeItsLeaseRunsDry) {
  lease_table t = make_table(leased(fixed_window_policy(1000, 60s)));
  std::int64_t now = 0;
  // Demand of 40 in one period, then a lease of 40.
  for (int i = 0; i < 40; ++i) {
    lease_plan p = t.check("k", 1, now, no_waiter);
    if (p.what == step::take) t.answered("k", grant(now, 1, p.want, 900, 60'000'000), now);
    if (p.refill > 0) t.failed("k");
  }
  now += 200 * ms;
  (void)t.expire(now);  // unchecked for a period: what those leases hold goes back
  lease_plan p = t.check("k", 1, now, no_waiter);
  ASSERT_EQ(p.what, step::take);
  EXPECT_EQ(p.want, 80);  // busy: about two periods' demand
  t.answered("k", grant(now, 1, 80, 800, 60'000'000), now);
  int admitted = 0;
  while ((p = t.check("k", 1, now, no_waiter)).what == step::admit && p.refill == 0) ++admitted;
  EXPECT_EQ(p.what, step::admit);
  EXPECT_EQ(admitted, 39);       // refilled once fewer than half of the 80 were left
  EXPECT_EQ(p.refill, 41 + 40);  // this period's demand so far and the last one's
  t.answered("k", grant(now, 0, p.refill, 700, 60'000'000), now);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(t.check("k", 1, now, no_waiter).what, step::admit) << i;
}

TEST(LeaseTableTest, ThreadsSharingAKeyNeverUseMoreThanWasLeased) {
  lease_table t = make_table(leased(fixed_window_policy(1'000'000, 60s), 10s, 0.5));
  (void)t.check("k", 1, 0, no_waiter);
  t.answered("k", grant(0, 1, 10'001, 0, 60'000'000), 0);
  std::atomic<int> admitted{0};
  std::vector<std::thread> pool;
  for (int i = 0; i < 4; ++i) {
    pool.emplace_back([&] {
      for (int n = 0; n < 5000; ++n) {
        lease_plan p = t.check("k", 1, 1, [] { return lease_waiter([](bool) {}); });
        if (p.what == step::admit) admitted.fetch_add(1);
        if (p.refill > 0) (void)t.failed("k");
      }
    });
  }
  for (auto& th : pool) th.join();
  EXPECT_EQ(admitted.load(), 10'000);
}

TEST(LeaseReplyTest, HostileRepliesAreProtocolErrors) {
  const rule r = leased(fixed_window_policy(10, 60s));
  const prepared_script p = prepare_script(r).value();
  replies b;
  auto reply = [&](long long allowed, long long units, redisReply* token) {
    return b.array({b.integer(allowed), b.integer(5), b.integer(0), b.integer(100), b.integer(units), token,
                    b.integer(1000), b.integer(7)});
  };
  auto ok = parse_lease_reply(p, false, 1, 5, *reply(1, 3, b.string("12")));
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->units, 3);
  EXPECT_EQ(ok->token, "12");
  EXPECT_EQ(ok->valid_us, 1000);
  EXPECT_EQ(ok->check.remaining, 5);
  EXPECT_FALSE(parse_lease_reply(p, false, 1, 5, *reply(0, 3, b.string("12"))).ok());   // units from a refusal
  EXPECT_FALSE(parse_lease_reply(p, false, 1, 5, *reply(1, -1, b.string("12"))).ok());  // negative units
  EXPECT_FALSE(parse_lease_reply(p, false, 1, 2, *reply(1, 3, b.string("12"))).ok());   // more than wanted
  EXPECT_FALSE(parse_lease_reply(p, false, 4, 5, *reply(1, 3, b.string("12"))).ok());   // fewer than the cost
  EXPECT_TRUE(parse_lease_reply(p, false, 1, 5, *reply(0, 0, b.string(""))).ok());      // a refusal
  EXPECT_FALSE(parse_lease_reply(p, false, 1, 5, *reply(2, 1, b.string("12"))).ok());   // allowed 2
  EXPECT_FALSE(parse_lease_reply(p, false, 1, 5, *reply(1, 1, b.integer(12))).ok());    // token not a string
  EXPECT_FALSE(parse_lease_reply(p, false, 1, 5, *reply(1, 1, b.string(std::string(300, 'x')))).ok());
  EXPECT_FALSE(parse_lease_reply(p, false, 1, 5, *b.integers({1, 5, 0, 100, 1})).ok());  // short
  EXPECT_FALSE(parse_lease_reply(p, false, 1, 5, *b.integer(1)).ok());
}

TEST(LeaseRuleTest, LeasesAreValidatedWithTheRule) {
  EXPECT_TRUE(validate(leased(fixed_window_policy(10, 60s))).ok());
  EXPECT_FALSE(validate(leased(sliding_window_policy(10, 60s))).ok());
  EXPECT_FALSE(validate(leased(fixed_window_policy(10, 60s), 1ms)).ok());
  EXPECT_FALSE(validate(leased(fixed_window_policy(10, 60s), 11s)).ok());
  EXPECT_FALSE(validate(leased(fixed_window_policy(10, 60s), 200ms, 0.6)).ok());
  EXPECT_FALSE(validate(leased(fixed_window_policy(10, 60s), 200ms, 0)).ok());
  rule dual{.name = "d", .limit = sliding_window_policy(5, 60s), .tenant = fixed_window_policy(50, 60s)};
  dual.lease = lease_policy{};
  EXPECT_TRUE(validate(dual).ok());  // the tenant layer is leased; the user's log stays exact
}

}  // namespace
}  // namespace sluice::detail
