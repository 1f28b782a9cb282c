// SPDX-License-Identifier: Apache-2.0
// sluice simulate: the pattern language, the seed's walk-through and the 2N pitfall as golden
// figures, and the chart's shape.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "chart.hpp"
#include "simulation.hpp"
#include "traffic.hpp"

namespace sluice::cli {
namespace {

using namespace std::chrono_literals;
constexpr std::int64_t second = 1'000'000'000;

std::vector<std::int64_t> traffic(std::string_view p) {
  auto t = parse_traffic(p);
  EXPECT_TRUE(t.ok()) << t.error().message;
  return t.ok() ? *t : std::vector<std::int64_t>{};
}

TEST(Traffic, BurstsRatesAndIdleGaps) {
  auto t = traffic("burst 3 at 1s; 2/s for 2s\nidle 10s; burst 1");
  EXPECT_EQ(t, (std::vector<std::int64_t>{second, second, second, second, second + second / 2, 2 * second,
                                          2 * second + second / 2, 13 * second}));
  EXPECT_EQ(traffic("10/s from 0s to 60s").size(), 600u);
  EXPECT_EQ(traffic("burst 2 at 5s; burst 1 at 1s").front(), second) << "times are sorted";
}

TEST(Traffic, ErrorsGiveLineAndColumn) {
  for (const auto& [pattern, message] : std::vector<std::pair<std::string, std::string>>{
           {"burst x at 0s", "1:7: expected a number of requests, got \"x\""},
           {"burst 5 at 0s\n10/s from 5s too 9s", "2:14: expected \"to\", got \"too\""},
           {"idle", "1:1: idle takes one duration"},
           {"jump 5", "1:1: expected burst, idle or a rate"},
           {"burst 1 at soon", "1:12: expected a time"},
           {"0/s for 1s", "1:1: expected a rate > 0"},
           {"5/s from 9s to 1s", "1:16: ends before it starts"},
           {"burst 1 at 1s extra", "1:15: unexpected \"extra\""},
           {"burst 20000000", "1:1: more than 10000000 requests"},
           {"burst 1 at 367d", "1:12: longer than 366d"},
           {"idle 200d; idle 200d", "1:17: goes past 366d"},
           {"idle 300d\n1/s for 100d", "2:9: goes past 366d"},
           {"1/s from 0s to 1000d", "1:16: longer than 366d"}}) {
    auto r = parse_traffic(pattern);
    ASSERT_FALSE(r.ok()) << pattern;
    EXPECT_EQ(r.error().message.rfind(message, 0), 0u) << r.error().message;
  }
}

// The seed note's walk-through of r = 5/s, b = 60: a burst of 61 (the 61st refused), one more
// 200 ms later (one token refilled), then after a minute's rest the bucket is full again.
TEST(Simulate, SeedWalkThrough) {
  auto s = simulate(token_bucket_policy(per_second(5), 60),
                    traffic("burst 61 at 0s; burst 1 at 200ms; burst 70 at 60200ms"), second, 60 * second);
  EXPECT_EQ(s.requests, 132);
  EXPECT_EQ(s.admitted, 121);
  EXPECT_EQ(s.refused, 11);
  EXPECT_EQ(s.steps[0].admitted, 61);
  EXPECT_EQ(s.steps[0].refused, 1);
  EXPECT_EQ(s.steps[60].admitted, 60);
  EXPECT_EQ(s.steps[60].refused, 10);
  const std::string table = render_table(s);
  EXPECT_NE(table.find("token_bucket rate=5/s burst=60\n"), std::string::npos) << table;
  EXPECT_NE(table.find("     total       132       121        11\n"), std::string::npos) << table;
}

// The 2N pitfall: r = N/60 s, b = N with 10 requests a second for a minute admits 2N − 1 in 60 s
// (119 while the burst drains at 10/s against a refill of 1/0.6 s, then one every 0.6 s: 80 more);
// a sliding window log of N per 60 s admits N.
TEST(Simulate, TwoNPitfall) {
  const auto t = traffic("10/s from 0s to 60s");
  auto bucket = simulate(token_bucket_policy(per_minute(100), 100), t, second, 60 * second);
  EXPECT_EQ(bucket.admitted, 199);
  EXPECT_EQ(bucket.max_admitted_in_window, 199);
  auto log = simulate(sliding_window_policy(100, 60s), t, second, 60 * second);
  EXPECT_EQ(log.admitted, 100);
  EXPECT_EQ(log.max_admitted_in_window, 100);
  EXPECT_NE(render_table(bucket).find("most admitted in any 60s: 199\n"), std::string::npos);
}

TEST(Traffic, CsvRowsWithKeys) {
  auto t = parse_csv("time,key\n1700000000.5,alice\n1700000000,bob\n\n1700000002,alice\r\n");
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(t->times, (std::vector<std::int64_t>{0, second / 2, 2 * second}));
  ASSERT_EQ(t->key_names.size(), 2u);
  EXPECT_EQ(t->key_names[t->keys[0]], "bob");
  EXPECT_EQ(t->key_names[t->keys[1]], "alice");
  auto bare = parse_csv("5\n6\n");
  ASSERT_TRUE(bare.ok());
  EXPECT_TRUE(bare->keys.empty()) << "no key column: one key";
  for (const auto& [csv, message] :
       std::vector<std::pair<std::string, std::string>>{{"1\n2\nsoon,k\n", "row 3: expected a time in seconds"},
                                                        {"1,a,b\n", "row 1: expected time[,key]"},
                                                        {"-1\n", "row 1: expected a time"},
                                                        {"0\n1e300\n", "the rows span more than 366d"},
                                                        {"", "no rows"}}) {
    auto r = parse_csv(csv);
    ASSERT_FALSE(r.ok()) << csv;
    EXPECT_EQ(r.error().message.rfind(message, 0), 0u) << r.error().message;
  }
}

TEST(Simulate, EachKeyHasItsOwnLimit) {
  auto t = parse_csv("0,a\n0,a\n0,a\n0,b\n0,b\n0,b\n").value();
  auto s = simulate(fixed_window_policy(2, 60s), t.times, second, 60 * second, 0, t.keys);
  EXPECT_EQ(s.admitted, 4);
  EXPECT_EQ(s.refused, 2);
  EXPECT_EQ(s.max_admitted_in_window, 2) << "the most any one key got";
  EXPECT_EQ(s.steps[0].remaining, 0);
}

// A step is chosen by the user: one that would make more rows than max_steps is refused before
// any is made (1ms over a year of traffic was 31 billion of them).
TEST(Simulate, StepsAreBounded) {
  const std::vector<std::int64_t> year{0, 365 * 86'400 * second};
  EXPECT_TRUE(check_steps(year, 60 * second).ok());
  auto fine = check_steps(year, 1'000'000);
  ASSERT_FALSE(fine.ok());
  EXPECT_EQ(fine.error().message.rfind("--step 0.001s makes 31536000001 rows, more than 1000000", 0), 0u)
      << fine.error().message;
  EXPECT_FALSE(check_steps(year, 0).ok());
  EXPECT_FALSE(check_steps(year, max_span_ns + 1).ok()) << "a step that would overflow start + step";
  EXPECT_TRUE(check_steps({}, max_span_ns).ok());
}

// One chart for every policy: per policy the trailing window's admissions, its limit, admitted per
// step and the budget left; the requests once; ticks on both axes of each of the three panels.
TEST(Chart, EveryPolicyOverlaidWithTicksAndLimits) {
  const auto t = traffic("burst 50 at 0s; 10/s for 30s");
  const std::vector<simulation> runs{simulate(token_bucket_policy(per_second(5), 60), t, second, 60 * second),
                                     simulate(fixed_window_policy(100, 60s), t, second, 60 * second)};
  const std::string svg = render_svg(runs);
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_TRUE(svg.ends_with("</svg>\n"));
  auto count = [&](const std::string& s) {
    std::size_t n = 0;
    for (auto at = svg.find(s); at != std::string::npos; at = svg.find(s, at + 1)) ++n;
    return n;
  };
  for (const char* series : {"in_window", "limit", "admitted", "remaining"}) {
    EXPECT_EQ(count(std::string("data-series=\"") + series + "\""), 2u) << series;
  }
  EXPECT_EQ(count("data-series=\"requests\""), 1u);
  EXPECT_EQ(count("data-policy=\"1\""), 4u);
  for (const char* panel : {"0", "1", "2"}) {
    EXPECT_GE(count(std::string("class=\"tick-y\" data-panel=\"") + panel + "\""), 3u) << panel;
    EXPECT_GE(count(std::string("class=\"tick-x\" data-panel=\"") + panel + "\""), 3u) << panel;
  }
  EXPECT_NE(svg.find(">0 s<"), std::string::npos);
  EXPECT_NE(svg.find(">30 s<"), std::string::npos) << "a tick on a round second";
  EXPECT_NE(svg.find(">100%<"), std::string::npos) << "the budget as a share of the capacity";
  EXPECT_NE(svg.find("fixed_window limit=100 window=60s: admitted"), std::string::npos) << "the legend";
  // Steps, not lines between points: each value holds over its step (H), then moves (V).
  const auto path = svg.find("data-series=\"admitted\"");
  ASSERT_NE(path, std::string::npos);
  EXPECT_NE(svg.find(" V", path), std::string::npos);
  EXPECT_NE(svg.find(" H", path), std::string::npos);
}

// --from and --to draw only those seconds: the axis starts and ends there.
TEST(Chart, FromAndToZoomOnTheSecondsAsked) {
  const auto t = traffic("10/s for 100s");
  const std::string svg = render_svg({simulate(fixed_window_policy(100, 60s), t, second, 60 * second)},
                                     {.from_ns = 50 * second, .to_ns = 70 * second});
  EXPECT_NE(svg.find(">50 s<"), std::string::npos);
  EXPECT_NE(svg.find(">70 s<"), std::string::npos);
  EXPECT_EQ(svg.find(">0 s<"), std::string::npos);
  EXPECT_EQ(svg.find(">90 s<"), std::string::npos);
}

// A trailing idle stays on the time axis.
TEST(Chart, ATrailingIdleIsDrawn) {
  std::int64_t end = 0;
  const auto t = parse_traffic("burst 5 at 0s; idle 30s", &end);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(end, 30 * second);
  const simulation s = simulate(fixed_window_policy(10, 60s), *t, second, 60 * second, end);
  EXPECT_EQ(s.steps.size(), 30u);
  EXPECT_NE(render_svg({s}).find(">30 s<"), std::string::npos);
}

}  // namespace
}  // namespace sluice::cli
