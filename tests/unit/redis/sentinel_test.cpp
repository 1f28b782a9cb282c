// SPDX-License-Identifier: Apache-2.0
// What sentinels say, read without a sentinel: get-master-addr-by-name's answers (an address, an
// unknown name, an error, hostile shapes) and +switch-master's payload (for this master or another,
// short, long, bad ports).
#include "redis/sentinel.hpp"

#include <gtest/gtest.h>

#include "unit/redis/reply_builder.hpp"

namespace sluice::detail {
namespace {

TEST(SentinelMasterAddress, ReadsTheAddress) {
  replies r;
  std::string why;
  auto e = read_master_address(*r.array({r.string("10.0.0.5"), r.string("6380")}), why);
  ASSERT_TRUE(e);
  EXPECT_EQ(*e, (endpoint{.host = "10.0.0.5", .port = 6380}));
  auto v6 = read_master_address(*r.array({r.string("::1"), r.string("6379")}), why);
  ASSERT_TRUE(v6);
  EXPECT_EQ(address_of(*v6), "[::1]:6379");
  auto name = read_master_address(*r.array({r.string("redis-0.example"), r.string("6379")}), why);
  ASSERT_TRUE(name);
  EXPECT_EQ(name->host, "redis-0.example");
}

TEST(SentinelMasterAddress, SaysWhyItNamesNone) {
  replies r;
  std::string why;
  EXPECT_FALSE(read_master_address(*r.nil(), why));
  EXPECT_EQ(why, "does not know the master's name");
  EXPECT_FALSE(read_master_address(*r.string("ERR unknown command 'SENTINEL'", REDIS_REPLY_ERROR), why));
  EXPECT_EQ(why, "answered ERR unknown command 'SENTINEL'");
  for (const redisReply* bad : {
           r.array({}),
           r.array({r.string("10.0.0.5")}),
           r.array({r.string("10.0.0.5"), r.integer(6379)}),
           r.array({r.string("10.0.0.5"), r.string("0")}),
           r.array({r.string("10.0.0.5"), r.string("65536")}),
           r.array({r.string("10.0.0.5"), r.string("63 79")}),
           r.array({r.string("10.0.0.5"), r.string("-1")}),
           r.array({r.string(""), r.string("6379")}),
           r.array({r.string("a b"), r.string("6379")}),
           r.array({r.string(std::string(300, 'a')), r.string("6379")}),
           r.array({r.string("10.0.0.5"), r.string("6379"), r.string("x")}),
           r.integer(1),
       }) {
    why.clear();
    EXPECT_FALSE(read_master_address(*bad, why));
    EXPECT_EQ(why, "named no readable address");
  }
}

TEST(SentinelSwitchMaster, ReadsTheNewMasterOfThisNameOnly) {
  auto e = read_switch_master("mymaster 127.0.0.1 6379 127.0.0.1 6380", "mymaster");
  ASSERT_TRUE(e);
  EXPECT_EQ(*e, (endpoint{.host = "127.0.0.1", .port = 6380}));
  EXPECT_FALSE(read_switch_master("other 127.0.0.1 6379 127.0.0.1 6380", "mymaster"));
  EXPECT_FALSE(read_switch_master("mymaster2 127.0.0.1 6379 127.0.0.1 6380", "mymaster"));
  EXPECT_FALSE(read_switch_master("mymaster 127.0.0.1 6379 127.0.0.1", "mymaster"));
  EXPECT_FALSE(read_switch_master("mymaster 127.0.0.1 6379 127.0.0.1 6380 extra", "mymaster"));
  EXPECT_FALSE(read_switch_master("mymaster 127.0.0.1 6379 127.0.0.1 99999", "mymaster"));
  EXPECT_FALSE(read_switch_master("", "mymaster"));
  EXPECT_FALSE(read_switch_master("mymaster  127.0.0.1 6379 127.0.0.1 6380", "mymaster"));
}

}  // namespace
}  // namespace sluice::detail
