// SPDX-License-Identifier: Apache-2.0
// The Redis server's clock as the backend sees it: the offset is a lower bound kept over one to two
// seconds of samples, and a deadline is only ever set once an offset is known. Local times are
// passed in: nothing sleeps.
#include "redis/server_clock.hpp"

#include <gtest/gtest.h>

#include <chrono>

namespace sluice::detail {
namespace {

using namespace std::chrono_literals;

constexpr std::int64_t local0 = 5'000'000'000;  // µs of our steady clock

TEST(ServerClock, NoDeadlineUntilAnOffsetIsKnown) {
  server_clock c;
  EXPECT_EQ(c.offset_us(), server_clock::unknown);
  EXPECT_EQ(c.server_us_at(local0 + 50'000), -1);
  c.observe(local0 + 1'000, local0);
  EXPECT_EQ(c.offset_us(), 1'000);
  EXPECT_EQ(c.server_us_at(local0 + 10 + 50'000), local0 + 10 + 50'000 + 1'000);
}

// A reply's server time was read before it arrived: the latest samples bound the offset from below,
// and the largest one is the tightest bound.
TEST(ServerClock, KeepsTheLargestSampleOfTheLastOneToTwoSeconds) {
  server_clock c;
  c.observe(local0 + 700, local0);              // offset 700
  c.observe(local0 + 100 + 900, local0 + 100);  // 900
  c.observe(local0 + 200 + 300, local0 + 200);  // 300: a slower reply, a looser bound
  EXPECT_EQ(c.offset_us(), 900);
  // A new epoch (over a second later) keeps the previous epoch's bound beside the new samples.
  c.observe(local0 + 1'500'000 + 200, local0 + 1'500'000);
  EXPECT_EQ(c.offset_us(), 900);
  // Another second on, the old epoch is forgotten: a server clock stepped back is followed.
  c.observe(local0 + 2'600'000 + 100, local0 + 2'600'000);
  EXPECT_EQ(c.offset_us(), 200);
  c.observe(local0 + 3'700'000 + 50, local0 + 3'700'000);
  EXPECT_EQ(c.offset_us(), 100);
}

TEST(ServerClock, NegativeOffsetsAndTheLocalClock) {
  server_clock c;
  c.observe(1'000, local0);  // a server clock far behind ours
  EXPECT_EQ(c.offset_us(), 1'000 - local0);
  EXPECT_EQ(c.server_us_at(local0 + 1'000), 1'000 + 1'000);
  const std::int64_t a = server_clock::local_now_us();
  const std::int64_t b = server_clock::local_now_us();
  EXPECT_LE(a, b);  // steady
}

}  // namespace
}  // namespace sluice::detail
