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

}  // namespace
}  // namespace sluice::etcd::detail
