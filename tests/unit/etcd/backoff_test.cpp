// SPDX-License-Identifier: Apache-2.0
#include "etcd/backoff.hpp"

#include <gtest/gtest.h>

namespace sluice::etcd::detail {
namespace {

using namespace std::chrono_literals;

TEST(BackoffTest, DoublesFromTheBaseUpToTheCapWithJitter) {
  backoff b(100ms, 1000ms);
  for (int round = 0; round < 50; ++round) {
    for (unsigned failures = 0; failures < 70; ++failures) {
      const auto ceiling = std::min<std::chrono::milliseconds>(1000ms, 100ms * (1LL << std::min(failures, 20u)));
      const auto d = b.delay(failures);
      EXPECT_GE(d, ceiling / 2) << failures;
      EXPECT_LE(d, ceiling) << failures;
    }
  }
}

TEST(BackoffTest, Varies) {
  backoff b(1000ms, 1000ms);
  auto first = b.delay(0);
  bool varied = false;
  for (int i = 0; i < 100 && !varied; ++i) varied = b.delay(0) != first;
  EXPECT_TRUE(varied);
}

TEST(RereadPacingTest, FullReadsCloseTogetherBackOffAndOneAfterALastingWatchDoesNot) {
  backoff b(100ms, 1000ms);
  reread_pacing p(b, 1000ms);
  const reread_pacing::clock::time_point t0{std::chrono::hours(1)};
  EXPECT_EQ(p.wait_before(t0), 0ms) << "the first read";
  p.read_ended(t0 + 5ms);
  auto t = t0 + 5ms;
  // Each read wanted at once after the one before (a watch canceled as soon as it is made): the
  // wait doubles with each, jittered down to half, up to the cap.
  for (unsigned n = 1; n <= 8; ++n) {
    const auto ceiling = std::min<std::chrono::milliseconds>(1000ms, 100ms * (1LL << n));
    const auto d = p.wait_before(t + 1ms);
    EXPECT_GE(d, ceiling / 2 - 1ms) << n;
    EXPECT_LE(d, ceiling - 1ms) << n;
    t += 1ms + d + 5ms;
    p.read_ended(t);
  }
  // Time already spent since the last read (a reconnection's backoff) counts toward the wait.
  EXPECT_LE(p.wait_before(t + 999ms), 1ms) << "the cap is 1000 ms: at most 1 ms is left";
  // A watch that lasted as long as `close`: the next read goes at once, and backs off afresh.
  EXPECT_EQ(p.wait_before(t + 1000ms), 0ms);
  p.read_ended(t + 1001ms);
  EXPECT_GE(p.wait_before(t + 1002ms), 99ms);
}

}  // namespace
}  // namespace sluice::etcd::detail
