// SPDX-License-Identifier: Apache-2.0
// A Redis Cluster's replies read without a cluster: key slots against known values, CLUSTER SHARDS
// (integer and 7.0.x string slot numbers) and CLUSTER SLOTS, redirections, and hostile replies —
// wrong types, odd maps, slots out of range, overlapping ranges, absent or bad ports.
#include "redis/cluster_topology.hpp"

#include <gtest/gtest.h>

#include <optional>

#include "redis/slot.hpp"
#include "unit/redis/reply_builder.hpp"

namespace sluice::detail {
namespace {

TEST(KeySlot, KnownValues) {
  EXPECT_EQ(crc16("123456789"), 0x31C3);  // CRC16/XMODEM's check value
  EXPECT_EQ(key_slot("123456789"), 0x31C3);
  EXPECT_EQ(key_slot("foo"), 12182);
  EXPECT_EQ(key_slot("bar"), 5061);
  EXPECT_EQ(key_slot(""), 0);
  // A hash tag: the bytes between the first '{' and the first '}' after it, when not empty.
  EXPECT_EQ(key_slot("{user1000}.following"), key_slot("user1000"));
  EXPECT_EQ(key_slot("x{foo}y{bar}"), key_slot("foo"));
  EXPECT_EQ(key_slot("{}foo"), crc16("{}foo") % slot_count);  // empty tag: the whole key
  EXPECT_EQ(key_slot("foo{}{bar}"), crc16("foo{}{bar}") % slot_count);
  EXPECT_EQ(key_slot("{{a}}"), key_slot("{a"));
  EXPECT_EQ(key_slot("a{b"), crc16("a{b") % slot_count);  // no closing brace
}

class Topology : public ::testing::Test {
 protected:
  // One CLUSTER SHARDS node: [name, value, ...].
  redisReply* shard_node(std::string ip, long long port, std::string role,
                         std::optional<std::string> endpoint = std::nullopt, std::string health = "online",
                         std::optional<long long> tls_port = std::nullopt) {
    std::vector<redisReply*> f = {r.string("id"),  r.string("abc"), r.string("port"),
                                  r.integer(port), r.string("ip"),  r.string(std::move(ip))};
    if (tls_port) f.insert(f.end(), {r.string("tls-port"), r.integer(*tls_port)});
    if (endpoint) f.insert(f.end(), {r.string("endpoint"), r.string(std::move(*endpoint))});
    f.insert(f.end(), {r.string("role"), r.string(std::move(role)), r.string("health"), r.string(std::move(health))});
    return r.array(std::move(f));
  }
  redisReply* shard(std::vector<redisReply*> slots, std::vector<redisReply*> nodes) {
    return r.array({r.string("slots"), r.array(std::move(slots)), r.string("nodes"), r.array(std::move(nodes))});
  }
  replies r;
};

TEST_F(Topology, ClusterShards) {
  const redisReply* reply = r.array({
      shard({r.integer(5461), r.integer(10922)},
            {shard_node("10.0.0.2", 6379, "replica"), shard_node("10.0.0.1", 6380, "master", "db1.example")}),
      shard({r.integer(0), r.integer(100), r.integer(200), r.integer(5460)}, {shard_node("10.0.0.3", 7000, "master")}),
      shard({r.string("10923"), r.string("16383")}, {shard_node("::1", 7001, "master")}),  // 7.0.x: strings
      shard({}, {shard_node("10.0.0.9", 7009, "master")}),  // a master without slots: left out
  });
  auto owners = parse_cluster_shards(*reply, "seed", false);
  ASSERT_TRUE(owners.ok()) << owners.error().message;
  EXPECT_EQ(*owners, (std::vector<slot_owner>{{0, 100, "10.0.0.3:7000"},
                                              {200, 5460, "10.0.0.3:7000"},
                                              {5461, 10922, "db1.example:6380"},
                                              {10923, 16383, "[::1]:7001"}}));
}

TEST_F(Topology, ClusterShardsOverTlsTakeTheTlsPort) {
  // A node with tls-cluster on lists its TLS port beside the plaintext one (if any).
  redisReply* both = shard_node("10.0.0.1", 6379, "master", std::nullopt, "online", 6380);
  const redisReply* reply = r.array({shard({r.integer(0), r.integer(16383)}, {both})});
  EXPECT_EQ(parse_cluster_shards(*reply, "seed", true)->front().master, "10.0.0.1:6380");
  EXPECT_EQ(parse_cluster_shards(*reply, "seed", false)->front().master, "10.0.0.1:6379");
  // Without a TLS port listed, its port is the one there is.
  const redisReply* plain =
      r.array({shard({r.integer(0), r.integer(16383)}, {shard_node("10.0.0.2", 7000, "master")})});
  EXPECT_EQ(parse_cluster_shards(*plain, "seed", true)->front().master, "10.0.0.2:7000");
}

TEST_F(Topology, ClusterShardsEndpoints) {
  // An empty endpoint is the node asked; "?" (unknown) falls back to the ip; neither usable: an error.
  const redisReply* empty = r.array({shard({r.integer(0), r.integer(16383)}, {shard_node("", 7000, "master", "")})});
  ASSERT_TRUE(parse_cluster_shards(*empty, "10.1.1.1", false).ok());
  EXPECT_EQ(parse_cluster_shards(*empty, "10.1.1.1", false)->front().master, "10.1.1.1:7000");
  const redisReply* unknown =
      r.array({shard({r.integer(0), r.integer(16383)}, {shard_node("10.0.0.8", 7000, "master", "?")})});
  EXPECT_EQ(parse_cluster_shards(*unknown, "10.1.1.1", false)->front().master, "10.0.0.8:7000");
  const redisReply* none = r.array({shard({r.integer(0), r.integer(16383)}, {shard_node("", 7000, "master", "?")})});
  EXPECT_FALSE(parse_cluster_shards(*none, "10.1.1.1", false).ok());
}

TEST_F(Topology, AFailedOldMasterListedFirstIsPassedOver) {
  // Redis 7.2 keeps a failed master in its shard, still "master", after its replica took over.
  const redisReply* reply = r.array(
      {shard({r.integer(0), r.integer(16383)}, {shard_node("10.0.0.1", 7000, "master", std::nullopt, "failed"),
                                                shard_node("10.0.0.2", 7001, "master", std::nullopt, "online")})});
  auto owners = parse_cluster_shards(*reply, "seed", false);
  ASSERT_TRUE(owners.ok());
  EXPECT_EQ(owners->front().master, "10.0.0.2:7001");
  const redisReply* only_failed = r.array(
      {shard({r.integer(0), r.integer(16383)}, {shard_node("10.0.0.1", 7000, "master", std::nullopt, "failed")})});
  EXPECT_TRUE(parse_cluster_shards(*only_failed, "seed", false)->empty());  // its slots stay unknown
}

TEST_F(Topology, ClusterShardsWithoutAMasterLeavesItsSlotsUnknown) {
  const redisReply* reply = r.array({shard({r.integer(0), r.integer(99)}, {shard_node("10.0.0.2", 6379, "replica")})});
  auto owners = parse_cluster_shards(*reply, "seed", false);
  ASSERT_TRUE(owners.ok());
  EXPECT_TRUE(owners->empty());
}

TEST_F(Topology, HostileClusterShardsAreErrors) {
  const auto refused = [&](const redisReply* reply) {
    auto owners = parse_cluster_shards(*reply, "seed", false);
    return !owners.ok() && owners.error().code == errc::backend_protocol;
  };
  EXPECT_TRUE(refused(r.integer(1)));
  EXPECT_TRUE(refused(r.array({r.integer(1)})));
  EXPECT_TRUE(refused(r.array({r.array({r.string("slots")})})));                           // odd map, no nodes
  EXPECT_TRUE(refused(r.array({shard({r.integer(0)}, {shard_node("a", 1, "master")})})));  // odd slot list
  EXPECT_TRUE(refused(r.array({shard({r.integer(0), r.integer(16384)}, {shard_node("a", 1, "master")})})));
  EXPECT_TRUE(refused(r.array({shard({r.integer(-1), r.integer(5)}, {shard_node("a", 1, "master")})})));
  EXPECT_TRUE(refused(r.array({shard({r.integer(9), r.integer(5)}, {shard_node("a", 1, "master")})})));
  EXPECT_TRUE(refused(r.array({shard({r.string("0x1"), r.integer(5)}, {shard_node("a", 1, "master")})})));
  EXPECT_TRUE(refused(r.array({shard({r.integer(0), r.integer(5)}, {shard_node("a", 0, "master")})})));
  EXPECT_TRUE(refused(r.array({shard({r.integer(0), r.integer(5)}, {shard_node("a", 65536, "master")})})));
  EXPECT_TRUE(
      refused(r.array({shard({r.integer(0), r.integer(5)}, {shard_node(std::string(300, 'h'), 1, "master")})})));
  EXPECT_TRUE(refused(r.array({shard({r.integer(0), r.integer(10)}, {shard_node("a", 1, "master")}),
                               shard({r.integer(10), r.integer(20)}, {shard_node("b", 1, "master")})})));  // overlap
}

TEST_F(Topology, ClusterSlots) {
  const redisReply* reply = r.array({
      r.array({r.integer(5461), r.integer(16383), r.array({r.string("10.0.0.1"), r.integer(6380), r.string("id")}),
               r.array({r.string("10.0.0.2"), r.integer(6381)})}),
      r.array({r.integer(0), r.integer(5460), r.array({r.string(""), r.integer(7000)})}),  // "": the node asked
  });
  auto owners = parse_cluster_slots(*reply, "10.9.9.9");
  ASSERT_TRUE(owners.ok()) << owners.error().message;
  EXPECT_EQ(*owners, (std::vector<slot_owner>{{0, 5460, "10.9.9.9:7000"}, {5461, 16383, "10.0.0.1:6380"}}));
}

TEST_F(Topology, HostileClusterSlotsAreErrors) {
  const auto refused = [&](const redisReply* reply) { return !parse_cluster_slots(*reply, "seed").ok(); };
  EXPECT_TRUE(refused(r.string("x")));
  EXPECT_TRUE(refused(r.array({r.array({r.integer(0), r.integer(5)})})));  // no master
  EXPECT_TRUE(refused(r.array({r.array({r.integer(0), r.integer(5), r.integer(7)})})));
  EXPECT_TRUE(refused(r.array({r.array({r.integer(0), r.integer(5), r.array({r.string("a")})})})));
  EXPECT_TRUE(refused(r.array({r.array({r.integer(0), r.integer(99999), r.array({r.string("a"), r.integer(1)})})})));
  EXPECT_TRUE(refused(r.array({r.array({r.integer(0), r.integer(5), r.array({r.string("a"), r.integer(-4)})})})));
  // "?" (unknown endpoint): its slots stay unknown.
  const redisReply* unknown = r.array({r.array({r.integer(0), r.integer(5), r.array({r.string("?"), r.integer(1)})})});
  EXPECT_TRUE(parse_cluster_slots(*unknown, "seed")->empty());
}

TEST(Redirection, MovedAndAsk) {
  auto moved = parse_redirection("MOVED 3999 127.0.0.1:6381", "seed");
  ASSERT_TRUE(moved.has_value());
  EXPECT_EQ(moved->slot, 3999);
  EXPECT_EQ(moved->address, "127.0.0.1:6381");
  auto ask = parse_redirection("ASK 16383 ::1:7000", "seed");  // IPv6, unbracketed as Redis writes it
  ASSERT_TRUE(ask.has_value());
  EXPECT_EQ(ask->address, "[::1]:7000");
  EXPECT_EQ(parse_redirection("MOVED 1 :7000", "10.0.0.4")->address, "10.0.0.4:7000");  // the node asked
  EXPECT_FALSE(parse_redirection("MOVED 1 ?:7000", "10.0.0.4").has_value());            // unknown
  for (const char* bad : {"MOVED", "MOVED 1", "MOVED 16384 a:1", "MOVED -1 a:1", "MOVED 1 a", "MOVED 1 a:0",
                          "MOVED 1 a:65536", "MOVED x a:1", "MOVED 1 a:1x"}) {
    EXPECT_FALSE(parse_redirection(bad, "seed").has_value()) << bad;
  }
}

TEST(HostOf, TheHostOfANodesAddress) {
  EXPECT_EQ(host_of("10.0.0.4:7000"), "10.0.0.4");
  EXPECT_EQ(host_of("[::1]:7000"), "::1");
  EXPECT_EQ(host_of("db1.example:6380"), "db1.example");
}

TEST(ClassifyError, TheWordsAClusterAnswers) {
  EXPECT_EQ(classify_error("MOVED 1 a:1"), reply_error::moved);
  EXPECT_EQ(classify_error("ASK 1 a:1"), reply_error::ask);
  EXPECT_EQ(classify_error("TRYAGAIN Multiple keys request during rehashing of slot"), reply_error::tryagain);
  EXPECT_EQ(classify_error("CLUSTERDOWN The cluster is down"), reply_error::clusterdown);
  EXPECT_EQ(classify_error("READONLY You can't write against a read only replica."), reply_error::readonly);
  EXPECT_EQ(classify_error("NOSCRIPT No matching script."), reply_error::noscript);
  EXPECT_EQ(classify_error("OOM command not allowed"), reply_error::oom);
  EXPECT_EQ(classify_error("CROSSSLOT Keys in request don't hash to the same slot"), reply_error::other);
  EXPECT_EQ(classify_error("ASKING"), reply_error::other);  // a word that starts like one is not it
  EXPECT_EQ(classify_error(""), reply_error::other);
}

}  // namespace
}  // namespace sluice::detail
