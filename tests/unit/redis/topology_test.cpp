// SPDX-License-Identifier: Apache-2.0
// Which node serves each slot, without a server: one Redis serves every slot, a Sentinel switch
// swaps the master whole, a cluster's map routes each range, MOVED storms patch slots until the next
// map, readiness needs every slot served by a node that answers, and idle nodes are let go. The
// nodes run on fake connections (fake_connection.hpp).
#include "redis/topology.hpp"

#include <gtest/gtest.h>

#include <boost/asio/io_context.hpp>

#include <map>

#include "redis/node.hpp"
#include "redis/slot.hpp"
#include "unit/redis/fake_connection.hpp"

namespace sluice::detail {
namespace {

// Nodes on fake connections: ready once their handshake answers, not once their connection is
// lost, out of memory once a script is refused for it.
class TopologyTest : public ::testing::Test, private node_owner {
 protected:
  node_ptr make(const std::string& address, bool ready = true) {
    std::shared_ptr<fake_connection> wire;
    const node_context context{
        .strand = strand_, .options = options_, .owner = *this, .counters = counters_, .log = log_};
    auto n = std::make_shared<node>(context, fake_connection::factory(wire, address));
    n->connect();
    if (ready) wire->handshake();
    wires_[n.get()] = wire;
    made_.push_back(n);
    return n;
  }
  void set_ready(node& n, bool ready) {
    if (!ready) return wires_[&n]->lose("gone");
    n.connect();
    wires_[&n]->handshake();
  }
  void run_out_of_memory(node& n) {
    n.send(checks_.make("k"), false);
    wires_[&n]->feed("-OOM command not allowed when used memory > 'maxmemory'.\r\n");
  }
  void TearDown() override {
    for (const auto& n : made_) n->close();
    io_.poll();
  }

  asio::io_context io_;
  strand_type strand_ = asio::make_strand(io_);
  redis_options options_;
  node_counters counters_;
  log_throttle log_{std::chrono::seconds(1)};
  test_checks checks_;
  std::map<node*, std::shared_ptr<fake_connection>> wires_;
  std::vector<node_ptr> made_;

 private:
  void answered(node&, const op_ptr&, redisReply*, bool) override {}
  void answered_batch(node&, std::vector<op_ptr>&, redisReply*) override {}
  void ready(node&) override {}
  void lost(node&, const std::string&) override {}
  void failed(const op_ptr&, errc, const std::string&) override {}
  void health_changed(node&) override {}
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
  set_ready(*n, false);
  EXPECT_FALSE(t.healthy());
  set_ready(*n, true);
  EXPECT_TRUE(t.healthy());
  run_out_of_memory(*n);
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
  set_ready(*new_master, true);
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
  set_ready(*t.find("a:1"), false);
  EXPECT_FALSE(t.healthy());
  // A node that serves no slot does not count: a replica given as a seed, down.
  set_ready(*t.find("a:1"), true);
  t.add(make("replica:1", false));
  EXPECT_TRUE(t.healthy());
  EXPECT_EQ(t.take_all().size(), 2u);
  EXPECT_EQ(t.route(0), nullptr);
}

TEST_F(TopologyTest, NodesAreBounded) {
  topology t(topology_kind::cluster);
  for (std::size_t i = 0; i < max_nodes; ++i) {
    ASSERT_TRUE(t.has_room());
    t.add(make(std::to_string(i) + ".example:1"));
  }
  EXPECT_FALSE(t.has_room());
}

}  // namespace
}  // namespace sluice::detail
