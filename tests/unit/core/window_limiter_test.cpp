// SPDX-License-Identifier: Apache-2.0
#include "sluice/window_limiter.hpp"
#include "sluice/limiter_state.hpp"
#include "sluice/window_states.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <deque>
#include <limits>
#include <random>

namespace sluice {
namespace {

using namespace std::chrono_literals;

constexpr time_point t0 = time_point(std::chrono::seconds(600));  // a multiple of every window used

template <class Limiter>
Limiter make(std::int64_t limit, nanoseconds window) {
  auto l = Limiter::create({.limit = limit, .window = window});
  EXPECT_TRUE(l.ok());
  return std::move(l).value();
}

template <class Limiter>
decision acquire(Limiter& l, time_point now, std::int64_t cost = 1) {
  auto d = l.try_acquire(now, cost);
  EXPECT_TRUE(d.ok()) << (d.ok() ? "" : d.error().message);
  return d.ok() ? d.value() : decision{};
}

// --- sliding window log ----------------------------------------------------------------------------

TEST(SlidingWindowLog, AdmitsLimitThenRefusesWithRetryUntilOldestLeaves) {
  auto log = make<sliding_window_log>(3, 60s);
  EXPECT_EQ(acquire(log, t0).remaining, 2);
  EXPECT_EQ(acquire(log, t0 + 10s).remaining, 1);
  decision third = acquire(log, t0 + 20s);
  EXPECT_TRUE(third.allowed);
  EXPECT_EQ(third.remaining, 0);
  EXPECT_EQ(third.reset_after, 60s);

  decision refused = acquire(log, t0 + 30s);
  EXPECT_FALSE(refused.allowed);
  EXPECT_EQ(refused.retry_after, 30s);  // oldest (t0) + 60 s − now
  EXPECT_EQ(refused.reset_after, 50s);  // newest (t0 + 20 s) + 60 s − now
  EXPECT_EQ(refused.limit, 3);
}

TEST(SlidingWindowLog, WindowSlides) {
  auto log = make<sliding_window_log>(2, 10s);
  EXPECT_TRUE(acquire(log, t0).allowed);
  EXPECT_TRUE(acquire(log, t0 + 5s).allowed);
  EXPECT_FALSE(acquire(log, t0 + 9s).allowed);
  EXPECT_FALSE(acquire(log, t0 + 10s - 1ns).allowed);
  EXPECT_TRUE(acquire(log, t0 + 10s).allowed);  // t0 has left (now − W, now]
  EXPECT_FALSE(acquire(log, t0 + 10s).allowed);
  EXPECT_TRUE(acquire(log, t0 + 15s).allowed);
}

TEST(SlidingWindowLog, RefusedRequestsAreNotRecorded) {
  auto log = make<sliding_window_log>(1, 10s);
  EXPECT_TRUE(acquire(log, t0).allowed);
  for (int i = 1; i < 10; ++i) EXPECT_FALSE(acquire(log, t0 + std::chrono::seconds(i)).allowed);
  EXPECT_TRUE(acquire(log, t0 + 10s).allowed);  // the refusals did not extend the window
}

TEST(SlidingWindowLog, CostRetryWaitsForEnoughEntries) {
  auto log = make<sliding_window_log>(5, 10s);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(acquire(log, t0 + std::chrono::seconds(i)).allowed);
  decision d = acquire(log, t0 + 5s, 3);  // the three oldest (t0, +1, +2) must leave
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after, 7s);
  EXPECT_TRUE(acquire(log, t0 + 12s, 3).allowed);
}

TEST(SlidingWindowLog, CostAboveLimitIsAnError) {
  auto log = make<sliding_window_log>(5, 10s);
  EXPECT_EQ(log.try_acquire(t0, 6).error(), errc::cost_exceeds_burst);
  EXPECT_EQ(log.try_acquire(t0, 0).error(), errc::invalid_argument);
}

TEST(SlidingWindowLog, InvalidOptionsNameTheParameter) {
  auto a = sliding_window_log::create({.limit = 0, .window = 1s});
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.error().message.find("limit"), std::string::npos);
  auto b = sliding_window_log::create({.limit = 1, .window = -1s});
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.error().message.find("window"), std::string::npos);
}

TEST(SlidingWindowLog, ReverseTimeIsNoTimePassing) {
  auto log = make<sliding_window_log>(1, 10s);
  EXPECT_TRUE(acquire(log, t0).allowed);
  EXPECT_FALSE(acquire(log, t0 - 1h).allowed);
  EXPECT_TRUE(acquire(log, t0 + 10s).allowed);
}

// Exactness: against a brute-force count, at most `limit` in every window (now − W, now].
TEST(SlidingWindowLog, NeverMoreThanLimitInAnyWindowRandomised) {
  constexpr std::int64_t limit = 7;
  constexpr auto window = 1s;
  auto log = make<sliding_window_log>(limit, window);
  std::mt19937_64 rng(42);
  std::deque<time_point> admitted;
  time_point now = t0;
  for (int i = 0; i < 20'000; ++i) {
    now += std::chrono::microseconds(rng() % 300'000);
    bool allowed = acquire(log, now).allowed;
    while (!admitted.empty() && admitted.front() <= now - window) admitted.pop_front();
    // The log admits exactly when the brute-force count has room.
    ASSERT_EQ(allowed, static_cast<std::int64_t>(admitted.size()) < limit) << "at step " << i;
    if (allowed) admitted.push_back(now);
  }
}

// The log's state against a reference that keeps one timestamp per admitted unit (the textbook
// log): every field of every decision agrees, for random costs, while the state holds one entry
// per admission and never more than `limit` entries.
TEST(SlidingWindowLogState, OneEntryPerAdmissionDecidesAsOnePerUnit) {
  const window_params p{.limit = 50, .window_ns = 1'000'000'000};
  sliding_window_log_state log;
  std::deque<std::int64_t> units;  // reference: one timestamp per unit
  std::mt19937_64 rng(7);
  std::int64_t now = 1'000'000'000'000;
  std::size_t admissions_live_max = 0;
  for (int i = 0; i < 20'000; ++i) {
    now += static_cast<std::int64_t>(rng() % 40'000'000);
    const std::int64_t cost = 1 + static_cast<std::int64_t>(rng() % 12);
    while (!units.empty() && units.front() <= now - p.window_ns) units.pop_front();
    const auto live = static_cast<std::int64_t>(units.size());
    decision want;
    want.limit = p.limit;
    if (live + cost <= p.limit) {
      want.allowed = true;
      want.remaining = p.limit - live - cost;
      want.reset_after = nanoseconds(p.window_ns);
    } else {
      want.remaining = p.limit - live;
      want.retry_after = nanoseconds(units[static_cast<std::size_t>(live + cost - p.limit - 1)] + p.window_ns - now);
      want.reset_after = nanoseconds(units.back() + p.window_ns - now);
    }
    const decision got = log.evaluate(p, now, cost);
    ASSERT_EQ(got.allowed, want.allowed) << "step " << i;
    ASSERT_EQ(got.remaining, want.remaining) << "step " << i;
    ASSERT_EQ(got.retry_after, want.retry_after) << "step " << i;
    ASSERT_EQ(got.reset_after, want.reset_after) << "step " << i;
    if (got.allowed) {
      log.commit(p, now, cost);
      units.insert(units.end(), static_cast<std::size_t>(cost), now);
    }
    ASSERT_LE(log.size(), static_cast<std::size_t>(p.limit));
    admissions_live_max = std::max(admissions_live_max, log.size());
  }
  EXPECT_LT(admissions_live_max, static_cast<std::size_t>(p.limit) / 2) << "entries are per admission, not per unit";
}

// Memory follows admissions, not units: a cost of 10,000 is one entry, as is a burst at one instant.
TEST(SlidingWindowLogState, MemoryIsPerAdmission) {
  const window_params p{.limit = 1'000'000, .window_ns = 60'000'000'000};
  sliding_window_log_state log;
  ASSERT_TRUE(check_and_commit(log, p, 1, 10'000).allowed);
  EXPECT_EQ(log.size(), 1u);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(check_and_commit(log, p, 2, 100).allowed);
  EXPECT_EQ(log.size(), 2u) << "admissions at one instant share an entry";
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(check_and_commit(log, p, 3 + i, 100).allowed);
  EXPECT_EQ(log.size(), 102u);
  EXPECT_LE(log.memory_bytes(), 256 * 16u);
  EXPECT_EQ(log.evaluate(p, 200, 1).remaining, 1'000'000 - 10'000 - 100 * 100 - 100 * 100 - 1);
}

// Limits near 2^63 with continuous traffic: the running totals are rebased, never overflow (UBSan).
TEST(SlidingWindowLogState, HugeLimitsNeverOverflow) {
  const std::int64_t max = std::numeric_limits<std::int64_t>::max();
  const window_params p{.limit = max, .window_ns = 10};
  sliding_window_log_state log;
  for (std::int64_t t = 0; t < 200; t += 3) {
    const decision d = check_and_commit(log, p, t, max / 4);
    ASSERT_TRUE(d.allowed || d.retry_after > nanoseconds::zero());
  }
}

// --- the 2N pitfall ----------------------------------------------------------------------------------

TEST(SlidingWindowLog, AdmitsExactlyNWhereATokenBucketWouldAdmit2N) {
  constexpr int n = 100;
  auto log = make<sliding_window_log>(n, 60s);
  int admitted = 0;
  for (int ms = 0; ms < 60'000; ms += 10) admitted += acquire(log, t0 + std::chrono::milliseconds(ms)).allowed;
  EXPECT_EQ(admitted, n);
}

// --- sliding window counter --------------------------------------------------------------------------

TEST(SlidingWindowCounter, WeighsThePreviousWindowByItsOverlap) {
  auto c = make<sliding_window_counter>(10, 10s);
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(acquire(c, t0 + 1s).allowed);
  EXPECT_FALSE(acquire(c, t0 + 2s).allowed);
  // At 30% into the next window the previous 10 weigh 7: three more fit.
  EXPECT_EQ(acquire(c, t0 + 13s).remaining, 2);
  EXPECT_TRUE(acquire(c, t0 + 13s).allowed);
  EXPECT_TRUE(acquire(c, t0 + 13s).allowed);
  decision refused = acquire(c, t0 + 13s);
  EXPECT_FALSE(refused.allowed);
  // 10 × (10 − e)/10 + 3 + 1 <= 10  ⇔  e >= 4 s: one second from now.
  EXPECT_EQ(refused.retry_after, 1s);
  EXPECT_TRUE(acquire(c, t0 + 14s).allowed);
}

TEST(SlidingWindowCounter, RetryIntoTheNextWindowWhenThisOneIsFull) {
  auto c = make<sliding_window_counter>(4, 10s);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(acquire(c, t0 + 5s).allowed);
  decision d = acquire(c, t0 + 5s);
  EXPECT_FALSE(d.allowed);
  // Next window: 4 × (10 − e)/10 + 1 <= 4  ⇔  e >= 2.5 s; the window starts in 5 s.
  EXPECT_EQ(d.retry_after, 7500ms);
  EXPECT_FALSE(acquire(c, t0 + 12500ms - 1ns).allowed);
  EXPECT_TRUE(acquire(c, t0 + 12500ms).allowed);
  EXPECT_EQ(d.reset_after, 15s);  // both windows empty at the end of the next one
}

TEST(SlidingWindowCounter, EmptiesAfterTwoWindows) {
  auto c = make<sliding_window_counter>(2, 10s);
  EXPECT_TRUE(acquire(c, t0).allowed);
  EXPECT_TRUE(acquire(c, t0).allowed);
  EXPECT_EQ(acquire(c, t0 + 20s).remaining, 1);
}

// The documented worst case: fewer than 2 × limit in one window of length W.
TEST(SlidingWindowCounter, WorstCaseStaysUnderTwiceTheLimit) {
  constexpr std::int64_t limit = 100;
  auto c = make<sliding_window_counter>(limit, 10s);
  int admitted = 0;
  for (int i = 0; i < 200; ++i) admitted += acquire(c, t0 + 10s - 1ms).allowed;  // end of a window
  for (int ms = 0; ms < 9'999; ms += 1) admitted += acquire(c, t0 + 10s + std::chrono::milliseconds(ms)).allowed;
  EXPECT_GT(admitted, limit);      // the approximation does let more through here
  EXPECT_LT(admitted, 2 * limit);  // but never twice the limit
}

// --- fixed window ------------------------------------------------------------------------------------

TEST(FixedWindow, CountsPerAlignedWindow) {
  auto q = make<fixed_window>(3, 24h);
  const time_point day = time_point(std::chrono::hours(24 * 1000));
  EXPECT_EQ(acquire(q, day + 1h).remaining, 2);
  EXPECT_TRUE(acquire(q, day + 2h).allowed);
  decision last = acquire(q, day + 3h);
  EXPECT_TRUE(last.allowed);
  EXPECT_EQ(last.reset_after, 21h);
  decision refused = acquire(q, day + 23h);
  EXPECT_FALSE(refused.allowed);
  EXPECT_EQ(refused.retry_after, 1h);
  EXPECT_TRUE(acquire(q, day + 24h).allowed);  // a new day
}

TEST(FixedWindow, AllowsTwiceTheLimitAcrossABoundary) {
  auto q = make<fixed_window>(5, 10s);
  int admitted = 0;
  for (int i = 0; i < 10; ++i) admitted += acquire(q, t0 + 10s - 1ns).allowed;
  for (int i = 0; i < 10; ++i) admitted += acquire(q, t0 + 10s).allowed;
  EXPECT_EQ(admitted, 10);
}

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

// Limits near the top of the 64-bit range neither overflow nor lose admissions.
// --- calendar windows (UTC) ------------------------------------------------------------------------

// ns since the epoch of a UTC date and time.
std::int64_t utc(std::chrono::year_month_day date, std::chrono::hours h = std::chrono::hours(0)) {
  return (std::chrono::sys_days(date) + h).time_since_epoch() / 1ns;
}

TEST(CalendarWindow, PeriodsFollowTheUtcCalendar) {
  using namespace std::chrono;
  auto period = [](calendar c, std::int64_t t) {
    return fixed_period(compiled_policy::from(calendar_window_policy(5, c)).window, t);
  };
  struct month_case {
    year_month_day inside, first, next;
  } months[] = {
      {2027y / January / 31, 2027y / January / 1, 2027y / February / 1},   // 31 days
      {2027y / February / 14, 2027y / February / 1, 2027y / March / 1},    // 28 days
      {2028y / February / 29, 2028y / February / 1, 2028y / March / 1},    // 29: a leap year
      {2100y / February / 28, 2100y / February / 1, 2100y / March / 1},    // 28: 2100 is not one
      {2027y / December / 31, 2027y / December / 1, 2028y / January / 1},  // the year's end
      {1969y / December / 15, 1969y / December / 1, 1970y / January / 1},  // before the epoch
  };
  for (const month_case& m : months) {
    for (std::int64_t t : {utc(m.inside, 13h), utc(m.first), utc(m.next) - 1}) {
      const window_period p = period(calendar::month, t);
      EXPECT_EQ(p.start, utc(m.first)) << t;
      EXPECT_EQ(p.end, utc(m.next)) << t;
    }
  }
  // ISO weeks start on Monday: 2027-01-01 is a Friday, in the week from Monday 2026-12-28.
  EXPECT_EQ(period(calendar::week, utc(2027y / January / 1, 23h)).start, utc(2026y / December / 28));
  EXPECT_EQ(period(calendar::week, utc(2027y / January / 3, 23h)).end, utc(2027y / January / 4));
  EXPECT_EQ(period(calendar::week, utc(2027y / January / 4)).start, utc(2027y / January / 4));
  EXPECT_EQ(period(calendar::week, utc(1970y / January / 1)).start, utc(1969y / December / 29));
  EXPECT_EQ(period(calendar::day, utc(2028y / February / 29, 23h)).start, utc(2028y / February / 29));
  EXPECT_EQ(period(calendar::day, utc(2028y / February / 29, 23h)).end, utc(2028y / March / 1));
}

TEST(CalendarWindow, AQuotaRenewsAtTheMonthsRealEnd) {
  using namespace std::chrono;
  const compiled_policy p = compiled_policy::from(calendar_window_policy(2, calendar::month));
  limiter_state s = limiter_state::make(p);
  const std::int64_t feb = utc(2028y / February / 10);
  ASSERT_TRUE(check_and_commit(s, p, feb, 2).allowed);
  const decision refused = check_and_commit(s, p, feb + 1, 1);
  EXPECT_FALSE(refused.allowed);
  EXPECT_EQ(refused.retry_after.count(), utc(2028y / March / 1) - feb - 1) << "the 29th counts";
  EXPECT_EQ(refused.reset_after, refused.retry_after);
  EXPECT_FALSE(check_and_commit(s, p, utc(2028y / February / 29, 23h), 1).allowed);
  EXPECT_TRUE(check_and_commit(s, p, utc(2028y / March / 1), 2).allowed) << "a new month, a new quota";
  EXPECT_EQ(s.idle_at(p), utc(2028y / April / 1));
  // March's last hour is still March.
  ASSERT_FALSE(check_and_commit(s, p, utc(2028y / March / 31, 23h), 1).allowed);
  EXPECT_TRUE(validate(calendar_window_policy(2, calendar::week)).ok());
  EXPECT_FALSE(validate({.algorithm = algorithm::sliding_window_log, .limit = 2, .window = days(31),
                         .calendar = calendar::month}).ok());
  EXPECT_FALSE(validate({.algorithm = algorithm::fixed_window, .limit = 2, .window = days(30),
                         .calendar = calendar::month}).ok());
}

TEST(WindowLimiters, HugeLimitsDoNotOverflow) {
  constexpr std::int64_t huge = std::numeric_limits<std::int64_t>::max();
  auto q = fixed_window::create({.limit = huge, .window = std::chrono::hours(1)}).value();
  EXPECT_TRUE(q.try_acquire(t0, huge - 1).value().allowed);
  EXPECT_TRUE(q.try_acquire(t0, 1).value().allowed);
  decision full = q.try_acquire(t0, huge).value();
  EXPECT_FALSE(full.allowed);
  EXPECT_EQ(full.remaining, 0);
  auto c = sliding_window_counter::create({.limit = huge, .window = std::chrono::hours(1)}).value();
  EXPECT_TRUE(c.try_acquire(t0, huge - 1).value().allowed);
  EXPECT_FALSE(c.try_acquire(t0, 2).value().allowed);
  auto log = sliding_window_log::create({.limit = huge, .window = std::chrono::hours(1)}).value();
  EXPECT_TRUE(log.try_acquire(t0, 1).value().allowed);
  EXPECT_EQ(log.try_acquire(t0, 1).value().remaining, huge - 2);
}

}  // namespace
}  // namespace sluice
