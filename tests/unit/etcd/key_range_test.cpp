// SPDX-License-Identifier: Apache-2.0
#include "etcd/key_range.hpp"

#include <gtest/gtest.h>

namespace sluice::etcd::detail {
namespace {

TEST(KeyRangeTest, EveryKeyWithThePrefix) {
  EXPECT_EQ(prefix_range("/sluice/"), (key_range{"/sluice/", "/sluice0"}));
  EXPECT_EQ(prefix_range("a"), (key_range{"a", "b"}));
  EXPECT_EQ(prefix_range("a\xff"), (key_range{"a\xff", "b"}));
  EXPECT_EQ(prefix_range("a\xfe"), (key_range{"a\xfe", "a\xff"}));
  EXPECT_EQ(prefix_range(std::string("a\0", 2)), (key_range{std::string("a\0", 2), std::string("a\1", 2)}));
}

TEST(KeyRangeTest, NothingToIncrementMeansToTheEndOfTheKeyspace) {
  const std::string end(1, '\0');
  EXPECT_EQ(prefix_range("\xff\xff"), (key_range{"\xff\xff", end}));
  EXPECT_EQ(prefix_range(""), (key_range{end, end}));
}

}  // namespace
}  // namespace sluice::etcd::detail
