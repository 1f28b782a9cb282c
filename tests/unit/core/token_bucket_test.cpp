// SPDX-License-Identifier: Apache-2.0
#include "sluice/token_bucket.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "sluice/testing/simulated_clock.hpp"

namespace sluice {
namespace {

using namespace std::chrono_literals;

constexpr time_point t0 = time_point(std::chrono::seconds(100));

token_bucket make(rate r, std::int64_t burst, clock* c = &real_clock()) {
  auto b = token_bucket::create({.rate = r, .burst = burst, .clock = c});
  EXPECT_TRUE(b.ok()) << (b.ok() ? "" : b.error().message);
  return std::move(b).value();
}

decision acquire(token_bucket& b, time_point now, std::int64_t cost = 1) {
  auto d = b.try_acquire(now, cost);
  EXPECT_TRUE(d.ok()) << (d.ok() ? "" : d.error().message);
  return d.ok() ? d.value() : decision{};
}

int admit_count(token_bucket& b, time_point now, int n) {
  int admitted = 0;
  for (int i = 0; i < n; ++i) admitted += acquire(b, now).allowed;
  return admitted;
}

// The seed note's walk-through: r = 5/s, b = 60.
TEST(TokenBucket, WalkThroughRate5Burst60) {
  token_bucket b = make(per_second(5), 60);
  decision first = acquire(b, t0);
  EXPECT_TRUE(first.allowed);
  EXPECT_EQ(first.limit, 60);
  EXPECT_EQ(first.remaining, 59);
  EXPECT_EQ(first.retry_after, 0ns);
  EXPECT_EQ(first.reset_after, 200ms);

  EXPECT_EQ(admit_count(b, t0, 59), 59);  // 60 pass at once
  decision refused = acquire(b, t0);      // the 61st
  EXPECT_FALSE(refused.allowed);
  EXPECT_EQ(refused.remaining, 0);
  EXPECT_EQ(refused.retry_after, 200ms);
  EXPECT_EQ(refused.reset_after, 12s);

  // A refusal takes nothing: 200 ms later exactly one token is back.
  EXPECT_TRUE(acquire(b, t0 + 200ms).allowed);
  EXPECT_FALSE(acquire(b, t0 + 200ms).allowed);
}

TEST(TokenBucket, SteadyScriptIsHeldToRate) {
  token_bucket b = make(per_second(5), 60);
  EXPECT_EQ(admit_count(b, t0, 60), 60);
  // A script asking 50 times a second for 20 s gets 5 per second.
  int admitted = 0;
  for (int i = 1; i <= 1000; ++i) admitted += acquire(b, t0 + i * 20ms).allowed;
  EXPECT_EQ(admitted, 100);
}

TEST(TokenBucket, IdleTimeRefillsToBurstOnly) {
  token_bucket b = make(per_second(5), 60);
  EXPECT_EQ(admit_count(b, t0, 60), 60);
  EXPECT_EQ(b.tokens(t0 + 1s), 5);
  EXPECT_EQ(b.tokens(t0 + 1h), 60);
  EXPECT_EQ(admit_count(b, t0 + 1h, 100), 60);
}

// The 2N pitfall: r = N/60 s, b = N admits about 2N within one 60 s span.
TEST(TokenBucket, TwoNPitfall) {
  constexpr int n = 100;
  token_bucket b = make(per_minute(n), n);
  int admitted = 0;
  for (int ms = 0; ms <= 60'000; ms += 10) admitted += acquire(b, t0 + std::chrono::milliseconds(ms)).allowed;
  EXPECT_EQ(admitted, 2 * n);  // the full bucket, then 100 refilled over the 60 s
}

struct cost_case {
  const char* name;
  double rate;
  std::int64_t burst;
  std::int64_t cost;
  bool allowed;
  std::int64_t remaining;
  nanoseconds retry_after;
};

class TokenBucketCost : public ::testing::TestWithParam<cost_case> {};

TEST_P(TokenBucketCost, FirstCheckOnAFullBucket) {
  const cost_case& c = GetParam();
  token_bucket b = make(per_second(c.rate), c.burst);
  decision d = acquire(b, t0, c.cost);
  EXPECT_EQ(d.allowed, c.allowed);
  EXPECT_EQ(d.remaining, c.remaining);
  EXPECT_EQ(d.retry_after, c.retry_after);
}

INSTANTIATE_TEST_SUITE_P(Bounds, TokenBucketCost,
                         ::testing::Values(cost_case{"one", 5, 60, 1, true, 59, 0ns},
                                           cost_case{"whole_burst", 5, 60, 60, true, 0, 0ns},
                                           cost_case{"burst_one", 1, 1, 1, true, 0, 0ns},
                                           cost_case{"big_rate", 1e6, 1000, 7, true, 993, 0ns},
                                           cost_case{"tiny_rate", 1e-3, 3, 3, true, 0, 0ns},
                                           cost_case{"burst_zero_refuses", 5, 0, 1, false, 0, never}),
                         [](const auto& info) { return info.param.name; });

TEST(TokenBucket, CostExceedsBurstIsAnError) {
  token_bucket b = make(per_second(5), 60);
  auto d = b.try_acquire(t0, 61);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error(), errc::cost_exceeds_burst);
  EXPECT_NE(d.error().message.find("burst 60"), std::string::npos);
  EXPECT_EQ(b.tokens(t0), 60);  // nothing taken
}

TEST(TokenBucket, NonPositiveCostIsAnError) {
  token_bucket b = make(per_second(5), 60);
  EXPECT_EQ(b.try_acquire(t0, 0).error(), errc::invalid_argument);
  EXPECT_EQ(b.try_acquire(t0, -3).error(), errc::invalid_argument);
}

TEST(TokenBucket, InvalidOptionsNameTheParameter) {
  auto r = token_bucket::create({.rate = per_second(-1), .burst = 1});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error(), errc::invalid_argument);
  EXPECT_NE(r.error().message.find("rate"), std::string::npos);
  auto b = token_bucket::create({.rate = per_second(1), .burst = -1});
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.error().message.find("burst"), std::string::npos);
  EXPECT_FALSE(token_bucket::create({.rate = per_second(std::nan("")), .burst = 1}).ok());
}

TEST(TokenBucket, InfiniteRateAlwaysAllows) {
  token_bucket b = make(rate::infinite(), 0);
  for (int i = 0; i < 1000; ++i) EXPECT_TRUE(acquire(b, t0, 1'000'000).allowed);
}

TEST(TokenBucket, ZeroRateNeverRefillsInPractice) {
  token_bucket b = make(per_second(0), 2);
  EXPECT_EQ(admit_count(b, t0, 5), 2);
  decision d = acquire(b, t0 + std::chrono::hours(24 * 365));
  EXPECT_FALSE(d.allowed);
  EXPECT_GT(d.retry_after, std::chrono::hours(24 * 365 * 10));
}

TEST(TokenBucket, ReverseTimeIsNoTimePassing) {
  token_bucket b = make(per_second(5), 2);
  EXPECT_EQ(admit_count(b, t0, 2), 2);
  decision d = acquire(b, t0 - 10s);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(admit_count(b, t0 + 200ms, 2), 1);
}

TEST(TokenBucket, HugeGapAndExtremeTimesDoNotOverflow) {
  token_bucket b = make(per_second(5), 60);
  const time_point far = time_point(nanoseconds(std::numeric_limits<std::int64_t>::max() - 1));
  EXPECT_TRUE(acquire(b, time_point(nanoseconds(std::numeric_limits<std::int64_t>::min()))).allowed);
  EXPECT_TRUE(acquire(b, far).allowed);
  EXPECT_GE(acquire(b, far).remaining, 0);
}

TEST(TokenBucket, ReserveReturnsTheDelayAndCancelGivesTokensBack) {
  token_bucket b = make(per_second(5), 10);
  EXPECT_EQ(admit_count(b, t0, 10), 10);
  auto r = b.reserve(t0, 3);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->delay_from(t0), 600ms);
  EXPECT_EQ(b.tokens(t0), -3);
  b.cancel(*r, t0 + 100ms);
  EXPECT_EQ(b.tokens(t0 + 200ms), 1);  // as if never reserved
}

TEST(TokenBucket, CancelKeepsLaterReservationsInPlace) {
  token_bucket b = make(per_second(10), 5);
  EXPECT_EQ(admit_count(b, t0, 5), 5);
  auto first = b.reserve(t0, 3);   // acts at +300 ms
  auto second = b.reserve(t0, 1);  // acts at +400 ms
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(second->delay_from(t0), 400ms);
  EXPECT_EQ(b.tokens(t0), -4);
  b.cancel(*first, t0);
  // As x/time/rate's CancelAt: the first's 3 tokens less the 1 reserved after it come back.
  EXPECT_EQ(b.tokens(t0), -2);
}

TEST(TokenBucket, CancelAfterTimeToActRestoresNothing) {
  token_bucket b = make(per_second(10), 5);
  EXPECT_EQ(admit_count(b, t0, 5), 5);
  auto r = b.reserve(t0, 1);
  ASSERT_TRUE(r.ok());
  b.cancel(*r, t0 + 100ms + 1ns);  // its moment has passed
  EXPECT_EQ(b.tokens(t0 + 100ms + 1ns), 0);
}

// The four cases, each against x/time/rate's answer.
TEST(TokenBucket, CancelAtTheMomentItBecomesUsableGivesBack) {
  token_bucket b = make(per_second(10), 5);
  auto r = b.reserve(t0, 5);  // usable at once
  ASSERT_TRUE(r.ok());
  b.cancel(*r, t0);
  EXPECT_TRUE(acquire(b, t0, 5).allowed);
}

TEST(TokenBucket, CancelAfterARateChangeGivesBackWhatXTimeRateDoes) {
  token_bucket b = make(per_second(1), 1);
  EXPECT_TRUE(acquire(b, t0).allowed);
  auto r = b.reserve(t0, 1);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(b.set_rate(per_second(0.5), t0).ok());
  b.cancel(*r, t0);
  EXPECT_EQ(b.reserve(t0, 1)->delay_from(t0), 2s);

  token_bucket c = make(per_second(1), 1);
  EXPECT_TRUE(acquire(c, t0).allowed);
  auto q = c.reserve(t0, 1);
  ASSERT_TRUE(q.ok());
  ASSERT_TRUE(c.set_burst(2, t0).ok());
  c.cancel(*q, t0);
  EXPECT_EQ(c.tokens(t0), 0);  // x/time/rate keeps the token the burst change did not add
  EXPECT_EQ(c.reserve(t0, 1)->delay_from(t0), 1s);
}

TEST(TokenBucket, IntervalsNotAMultipleOf4nsAreExact) {
  token_bucket b = make(per_second(1e8), 12);  // interval 10 ns
  EXPECT_EQ(admit_count(b, t0, 20), 12);
  int admitted = 0;
  for (int i = 1; i <= 100; ++i) admitted += acquire(b, t0 + i * 10ns).allowed;
  EXPECT_EQ(admitted, 100);
  token_bucket fastest = make(per_second(1e9), 1);
  admitted = 0;
  for (int i = 1; i <= 1000; ++i) admitted += acquire(fastest, t0 + i * 1ns).allowed;
  EXPECT_EQ(admitted, 1000);
}

TEST(TokenBucket, TimeGoingBackIsEvaluatedAtTheLatestWrite) {
  token_bucket b = make(per_second(1e6), 60);
  const time_point start(nanoseconds(0));
  EXPECT_TRUE(acquire(b, start + 4'000'002ns).allowed);
  decision d = acquire(b, start + 2ns);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 58);
  EXPECT_EQ(b.tokens(start), 58);
}

TEST(TokenBucket, WaitFailsAtOnceWhenTheDeadlineCannotBeMet) {
  testing::simulated_clock clock(t0);
  token_bucket b = make(per_second(5), 10, &clock);
  EXPECT_EQ(admit_count(b, t0, 10), 10);
  auto w = b.wait(1, t0 + 100ms);  // the next token comes at +200 ms
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.error(), errc::deadline_exceeded);
  EXPECT_EQ(b.tokens(t0 + 200ms), 1);  // nothing taken
}

TEST(TokenBucket, WaitReturnsWhenTokensArrive) {
  testing::simulated_clock clock(t0);
  token_bucket b = make(per_second(5), 10, &clock);
  EXPECT_EQ(admit_count(b, t0, 10), 10);
  std::jthread waiter([&] { EXPECT_TRUE(b.wait(2, t0 + 1s).ok()); });
  while (clock.sleepers_for_test() == 0) std::this_thread::yield();
  clock.advance(400ms);
  waiter.join();
  EXPECT_EQ(b.tokens(clock.now()), 0);  // the waiter took the two tokens
}

TEST(TokenBucket, WaitCancelledThroughStopTokenGivesTokensBack) {
  testing::simulated_clock clock(t0);
  token_bucket b = make(per_second(5), 10, &clock);
  EXPECT_EQ(admit_count(b, t0, 10), 10);
  std::stop_source stop;
  result<void> outcome;
  std::jthread waiter([&] { outcome = b.wait(3, t0 + 10s, stop.get_token()); });
  while (clock.sleepers_for_test() == 0) std::this_thread::yield();
  stop.request_stop();
  waiter.join();
  ASSERT_FALSE(outcome.ok());
  EXPECT_EQ(outcome.error(), errc::cancelled);
  EXPECT_EQ(b.tokens(t0), 0);  // the reserved three came back
}

TEST(TokenBucket, SetRateLiveKeepsTokens) {
  token_bucket b = make(per_second(5), 60);
  EXPECT_EQ(admit_count(b, t0, 50), 50);  // 10 left
  ASSERT_TRUE(b.set_rate(per_second(1), t0).ok());
  EXPECT_EQ(b.tokens(t0), 10);
  EXPECT_EQ(b.tokens(t0 + 1s), 11);  // now refilling at 1/s
  EXPECT_FALSE(b.set_rate(per_second(-2), t0).ok());
  EXPECT_EQ(b.rate(), per_second(1));
}

TEST(TokenBucket, SetBurstLiveCapsTokens) {
  token_bucket b = make(per_second(5), 60);
  ASSERT_TRUE(b.set_burst(10, t0).ok());
  EXPECT_EQ(b.burst(), 10);
  EXPECT_EQ(admit_count(b, t0, 20), 10);
  ASSERT_TRUE(b.set_burst(20, t0).ok());
  EXPECT_EQ(b.tokens(t0), 0);  // raising the burst adds no tokens
  EXPECT_EQ(b.tokens(t0 + 10s), 20);
}

TEST(TokenBucket, ConvenienceOverloadReadsTheClock) {
  testing::simulated_clock clock(t0);
  token_bucket b = make(per_second(1), 1, &clock);
  EXPECT_TRUE(b.try_acquire().value().allowed);
  EXPECT_FALSE(b.try_acquire().value().allowed);
  clock.advance(1s);
  EXPECT_TRUE(b.try_acquire().value().allowed);
}

}  // namespace
}  // namespace sluice
