// Which node serves each slot, without a server: one Redis serves every slot, a Sentinel switch
// swaps the master whole, a cluster's map routes each range, MOVED storms patch slots until the next
// map, readiness needs every slot served by a node that answers, and idle nodes are let go.
#include "redis/topology.hpp"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>

#include "redis/engine.hpp"
#include "redis/slot.hpp"

namespace sluice::detail {
namespace {

class TopologyTest : public ::testing::Test {
 protected:
  // A node as the engine makes one, unconnected; `ready` as after its handshake.
  node_ptr make(const std::string& address, bool ready = true) {
    auto n = std::make_shared<node>(strand_, options_);
    n->address = address;
    n->ready = ready;
    return n;
  }

  asio::io_context io_;
  strand_type strand_ = asio::make_strand(io_);
  redis_options options_;
};

TEST_F(TopologyTest, OneServerServesEverySlot) {
  topology t(topology_kind::one_server);
  EXPECT_EQ(t.route(0), nullptr);
  EXPECT_FALSE(t.healthy());
  node_ptr n = make("127.0.0.1:6379");
  EXPECT_EQ(t.serve_all(n), nullptr);
  for (std::uint16_t slot : {0, 1, 8000, slot_count - 1}) EXPECT_EQ(t.route(slot), n.get());
  EXPECT_EQ(t.only(), n.get());
  EXPECT_TRUE(t.healthy());
  EXPECT_FALSE(t.one_slot_a_call()) << "one server runs a call over any keys";
  n->ready = false;
  EXPECT_FALSE(t.healthy());
  n->ready = true;
  n->out_of_memory = true;
  EXPECT_FALSE(t.healthy());
  EXPECT_TRUE(t.out_of_memory());
}

TEST_F(TopologyTest, ASentinelSwitchSwapsTheMasterWhole) {
  topology t(topology_kind::sentinel);
  node_ptr old_master = make("10.0.0.1:6379");
  t.serve_all(old_master);
  node_ptr new_master = make("10.0.0.2:6379", false);
  EXPECT_EQ(t.serve_all(new_master), old_master) << "the old master is handed back, to be closed";
  EXPECT_EQ(t.nodes().size(), 1u);
  EXPECT_EQ(t.route(42), new_master.get());
  EXPECT_FALSE(t.healthy()) << "not before the new master's handshake (its ROLE) is answered";
  new_master->ready = true;
  EXPECT_TRUE(t.healthy());
}

TEST_F(TopologyTest, AClusterMapRoutesEachRangeAndAMovedStormPatchesSlotsUntilTheNextMap) {
  topology t(topology_kind::cluster);
  EXPECT_TRUE(t.one_slot_a_call());
  const auto node_at = [&](const std::string& address) -> node* {
    if (node* n = t.find(address)) return n;
    if (address == "bad") return nullptr;
    return &t.add(make(address));
  };
  const std::vector<slot_owner> three = {
      {.first = 0, .last = 5460, .master = "a:1"},
      {.first = 5461, .last = 10922, .master = "b:1"},
      {.first = 10923, .last = slot_count - 1, .master = "c:1"},
  };
  t.apply(three, node_at);
  EXPECT_TRUE(t.healthy());
  EXPECT_EQ(t.route(0)->address, "a:1");
  EXPECT_EQ(t.route(5461)->address, "b:1");
  EXPECT_EQ(t.route(slot_count - 1)->address, "c:1");

  // Every slot of a's range moved to d, one MOVED at a time.
  node& d = *node_at("d:1");
  for (std::uint16_t slot = 0; slot <= 5460; ++slot) t.moved(slot, d);
  EXPECT_EQ(t.route(0), &d);
  EXPECT_EQ(t.route(5460), &d);
  EXPECT_EQ(t.route(5461)->address, "b:1");
  EXPECT_TRUE(d.serves);
  // a serves nothing now, but keeps its flag until a map says so: it is not let go yet.
  EXPECT_TRUE(t.take_idle([](const node&) { return true; }).empty());

  // The next map replaces every patch; a, serving nothing, may go once idle.
  const std::vector<slot_owner> after = {
      {.first = 0, .last = 5460, .master = "d:1"},
      {.first = 5461, .last = 10922, .master = "b:1"},
      {.first = 10923, .last = slot_count - 1, .master = "c:1"},
  };
  t.apply(after, node_at);
  EXPECT_FALSE(t.find("a:1")->serves);
  EXPECT_TRUE(t.take_idle([](const node& n) { return n.address != "a:1"; }).empty()) << "a is busy";
  auto gone = t.take_idle([](const node&) { return true; });
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone.front()->address, "a:1");
  EXPECT_EQ(t.find("a:1"), nullptr);
  EXPECT_TRUE(t.healthy());
}

TEST_F(TopologyTest, AClusterIsNotReadyWhileASlotHasNoMasterThatAnswers) {
  topology t(topology_kind::cluster);
  const auto node_at = [&](const std::string& address) -> node* {
    if (node* n = t.find(address)) return n;
    if (address == "bad") return nullptr;
    return &t.add(make(address));
  };
  // A range whose master's address does not parse stays unknown.
  t.apply({{.first = 0, .last = 100, .master = "bad"}, {.first = 101, .last = slot_count - 1, .master = "a:1"}},
          node_at);
  EXPECT_EQ(t.route(50), nullptr);
  EXPECT_EQ(t.route(101)->address, "a:1");
  EXPECT_FALSE(t.healthy());
  t.apply({{.first = 0, .last = slot_count - 1, .master = "a:1"}}, node_at);
  EXPECT_TRUE(t.healthy());
  t.find("a:1")->ready = false;
  EXPECT_FALSE(t.healthy());
  // A node that serves no slot does not count: a replica given as a seed, down.
  t.find("a:1")->ready = true;
  t.add(make("replica:1", false));
  EXPECT_TRUE(t.healthy());
  EXPECT_EQ(t.take_all().size(), 2u);
  EXPECT_EQ(t.route(0), nullptr);
}

TEST_F(TopologyTest, NodesAreBounded) {
  topology t(topology_kind::cluster);
  for (std::size_t i = 0; i < max_nodes; ++i) {
    ASSERT_TRUE(t.has_room());
    t.add(make("n" + std::to_string(i) + ":1"));
  }
  EXPECT_FALSE(t.has_room());
}

}  // namespace
}  // namespace sluice::detail
