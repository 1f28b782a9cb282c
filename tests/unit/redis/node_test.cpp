// SPDX-License-Identifier: Apache-2.0
// One Redis server as the engine sees it (node.hpp), against a fake connection: a check goes alone
// on an idle node and in one batch call while one is in flight; replies cut at every byte reach the
// owner whole and in order; a master a sentinel named sends nothing until its handshake confirms it
// (a replica named by mistake never gets a write); MOVED storms are handed back, never resent; the
// breaker, out-of-memory and close.
#include "redis/node.hpp"

#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <deque>
#include <string>
#include <vector>

#include "redis/command.hpp"
#include "redis/scripts.hpp"
#include "unit/redis/fake_connection.hpp"

namespace sluice::detail {
namespace {

using namespace std::chrono_literals;

// What the node reported, in order.
class recording_owner final : public node_owner {
 public:
  struct answer {
    op_ptr o;  // null for a batch
    std::vector<op_ptr> batch;
    std::string reply;  // "lost", "error:<text>", "array:<n>", "other"
    bool asking = false;
  };

  void answered(node&, const op_ptr& o, redisReply* reply, bool asking) override {
    answers.push_back({o, {}, describe(reply), asking});
  }
  void answered_batch(node&, std::vector<op_ptr>& ops, redisReply* reply) override {
    answers.push_back({nullptr, ops, describe(reply), false});
  }
  void ready(node&) override { ++readies; }
  void lost(node&, const std::string& why) override { losses.push_back(why); }
  void failed(const op_ptr& o, errc, const std::string& why) override {
    o->done = true;
    failures.push_back(why);
  }
  void health_changed(node&) override { ++health_changes; }

  std::vector<answer> answers;
  std::vector<std::string> losses;
  std::vector<std::string> failures;
  int readies = 0;
  int health_changes = 0;

 private:
  static std::string describe(const redisReply* r) {
    if (r == nullptr) return "lost";
    if (r->type == REDIS_REPLY_ERROR) return "error:" + std::string(r->str, r->len);
    if (r->type == REDIS_REPLY_ARRAY) return "array:" + std::to_string(r->elements);
    return "other";
  }
};

// A script's reply to one check: allowed, remaining, retry, reset, then the server's time (µs).
std::string check_reply(long long remaining, long long server_us) {
  return "*5\r\n:1\r\n:" + std::to_string(remaining) + "\r\n:0\r\n:0\r\n:" + std::to_string(server_us) + "\r\n";
}

class NodeTest : public ::testing::Test {
 protected:
  node_ptr make(connection::peer who = connection::peer::server, const char* address = "10.0.0.1:6379") {
    auto n = std::make_shared<node>(context(), fake_connection::factory(wire_, address), who);
    n->connect();
    made_.push_back(n);
    return n;
  }
  // No probe or flush outlives the test.
  void TearDown() override {
    for (const auto& n : made_) n->close();
    run();
  }
  node_context context() {
    return {.strand = strand_, .options = options_, .owner = owner_, .counters = counters_, .log = log_};
  }
  op_ptr check(std::string key) { return checks_.make(std::move(key)); }
  // Runs what the node posted (a batch's flush).
  void run() {
    io_.restart();
    io_.poll();
  }

  asio::io_context io_;
  strand_type strand_ = asio::make_strand(io_);
  redis_options options_;
  recording_owner owner_;
  node_counters counters_;
  log_throttle log_{1s};
  test_checks checks_;
  std::shared_ptr<fake_connection> wire_;
  std::vector<node_ptr> made_;
};

TEST_F(NodeTest, AnIdleNodeSendsACheckAloneAndTheChecksThatComeMeanwhileInOneBatchCall) {
  node_ptr n = make();
  wire_->handshake();
  EXPECT_TRUE(n->ready());
  EXPECT_EQ(owner_.readies, 1);

  op_ptr first = check("a");
  n->send(first, false);
  ASSERT_EQ(wire_->sent().size(), 1u);
  EXPECT_NE(wire_->sent()[0].find(scripts()[checks_.call().script].sha1), std::string::npos)
      << "EVALSHA of the rule's own script";
  EXPECT_EQ(first->sent_to, n.get());

  // While the first is in flight, two more wait for the flush the node posted, then go together.
  op_ptr second = check("b");
  op_ptr third = check("c");
  n->send(second, false);
  n->send(third, false);
  EXPECT_EQ(wire_->sent().size(), 1u) << "nothing sent before the flush";
  run();
  ASSERT_EQ(wire_->sent().size(), 2u);
  EXPECT_NE(wire_->sent()[1].find(scripts()[batch_script].sha1), std::string::npos) << "one call of the batch script";
  EXPECT_EQ(n->in_flight(), 2u);
  EXPECT_EQ(counters_.calls.load(), 2u);

  wire_->feed(check_reply(9, 1'700'000'000'000'001));
  wire_->feed("*3\r\n*2\r\n:1\r\n:8\r\n*2\r\n:1\r\n:7\r\n:1700000000000002\r\n");
  ASSERT_EQ(owner_.answers.size(), 2u);
  EXPECT_EQ(owner_.answers[0].o, first);
  EXPECT_EQ(owner_.answers[0].reply, "array:5");
  EXPECT_EQ(owner_.answers[1].batch, (std::vector<op_ptr>{second, third}));
  EXPECT_EQ(owner_.answers[1].reply, "array:3");
  EXPECT_EQ(n->in_flight(), 0u);
  EXPECT_EQ(first->sent_to, nullptr);
  EXPECT_EQ(third->sent_to, nullptr);
}

TEST_F(NodeTest, RepliesCutAtEveryByteReachTheOwnerWholeAndInOrder) {
  node_ptr n = make();
  wire_->handshake();
  options_.max_batch = 1;  // each check alone: three replies in the pipeline
  std::vector<op_ptr> ops{check("a"), check("b"), check("c")};
  for (const auto& o : ops) n->send(o, false);
  ASSERT_EQ(wire_->sent().size(), 3u);
  const std::string bytes =
      check_reply(9, 1'700'000'000'000'001) + "-ERR something odd\r\n" + check_reply(7, 1'700'000'000'000'002);
  // Where each reply ends: until its last byte, the owner has heard of the ones before only.
  const std::size_t first_end = check_reply(9, 1'700'000'000'000'001).size();
  const std::vector<std::size_t> ends{first_end, first_end + 20, bytes.size()};
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    wire_->feed(bytes.substr(i, 1));
    const auto whole =
        static_cast<std::size_t>(std::count_if(ends.begin(), ends.end(), [&](std::size_t e) { return e <= i + 1; }));
    ASSERT_EQ(owner_.answers.size(), whole) << "after byte " << i;
  }
  ASSERT_EQ(owner_.answers.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(owner_.answers[i].o, ops[i]);
  EXPECT_EQ(owner_.answers[0].reply, "array:5");
  EXPECT_EQ(owner_.answers[1].reply, "error:ERR something odd");
  EXPECT_EQ(owner_.answers[2].reply, "array:5");
  EXPECT_EQ(n->in_flight(), 0u);
}

TEST_F(NodeTest, AMasterASentinelNamedGetsNoWriteUntilItsHandshakeConfirmsIt) {
  // The sentinel named a replica: the handshake's ROLE refuses it, and the connection is lost.
  node_ptr replica = make(connection::peer::master);
  op_ptr o = check("a");
  replica->send(o, false);
  EXPECT_TRUE(wire_->sent().empty()) << "nothing before ROLE has said master";
  wire_->lose("10.0.0.1:6379 is a replica (ROLE), not the master");
  EXPECT_TRUE(wire_->sent().empty());
  ASSERT_EQ(owner_.failures.size(), 1u);
  EXPECT_EQ(owner_.failures[0], "10.0.0.1:6379 is a replica (ROLE), not the master");
  EXPECT_EQ(owner_.losses.size(), 1u);
  EXPECT_FALSE(replica->ready());
  EXPECT_FALSE(replica->answers());

  // A master whose handshake answers takes what waited, once it is confirmed.
  node_ptr master = make(connection::peer::master, "10.0.0.2:6379");
  op_ptr waiting = check("b");
  master->send(waiting, false);
  wire_->handshake();
  ASSERT_EQ(wire_->sent().size(), 1u);
  EXPECT_EQ(waiting->sent_to, master.get());
}

TEST_F(NodeTest, AMovedStormIsHandedBackCheckByCheckAndNothingIsResent) {
  node_ptr n = make();
  wire_->handshake();
  options_.max_batch = 1;
  std::vector<op_ptr> ops;
  for (int i = 0; i < 50; ++i) {
    ops.push_back(check(std::to_string(i)));
    n->send(ops.back(), /*asking=*/i % 2 == 1);
  }
  // An ASK's check goes after ASKING, whose +OK nobody waits for.
  ASSERT_EQ(wire_->sent().size(), 75u);
  EXPECT_EQ(wire_->sent()[1], "*1\r\n$6\r\nASKING\r\n");
  for (int i = 0; i < 50; ++i) {
    if (i % 2 == 1) wire_->feed("+OK\r\n");
    wire_->feed("-MOVED 42 10.0.0.2:6379\r\n");
  }
  ASSERT_EQ(owner_.answers.size(), 50u);
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(owner_.answers[i].o, ops[i]);
    EXPECT_EQ(owner_.answers[i].reply, "error:MOVED 42 10.0.0.2:6379");
    EXPECT_EQ(owner_.answers[i].asking, i % 2 == 1);
  }
  EXPECT_EQ(wire_->sent().size(), 75u) << "where a check goes next is the owner's to say";
  EXPECT_TRUE(n->answers()) << "a redirection is no failure of the node";
  EXPECT_EQ(n->in_flight(), 0u);
}

TEST_F(NodeTest, TheCircuitOpensAtTheThresholdRefusesChecksAndClosesWithTheNextHandshake) {
  options_.breaker_failure_threshold = 3;
  node_ptr n = make();
  wire_->handshake();
  n->failed(2);
  EXPECT_FALSE(n->circuit_open());
  n->failed(1);
  EXPECT_TRUE(n->circuit_open());
  EXPECT_FALSE(n->answers());
  EXPECT_EQ(wire_->drops(), (std::vector<std::string>{"3 consecutive failures"}));
  EXPECT_EQ(counters_.open_circuits.load(), 1);
  EXPECT_EQ(counters_.circuit_opens.load(), 1u);
  EXPECT_EQ(owner_.health_changes, 1);

  op_ptr o = check("a");
  n->send(o, false);
  EXPECT_EQ(owner_.failures, (std::vector<std::string>{"circuit open for 10.0.0.1:6379"}));
  EXPECT_EQ(wire_->sent().size(), 0u);

  wire_->lose("dropped");
  n->connect();  // as the breaker's probe does
  wire_->handshake();
  EXPECT_FALSE(n->circuit_open());
  EXPECT_EQ(counters_.open_circuits.load(), 0);
  EXPECT_TRUE(n->answers());
}

TEST_F(NodeTest, AnOutOfMemoryReplyMarksTheNodeUntilAScriptRunsAgain) {
  node_ptr n = make();
  wire_->handshake();
  n->send(check("a"), false);
  wire_->feed("-OOM command not allowed when used memory > 'maxmemory'.\r\n");
  EXPECT_TRUE(n->out_of_memory());
  EXPECT_FALSE(n->answers());
  EXPECT_EQ(owner_.health_changes, 1);
  n->send(check("b"), false);
  wire_->feed(check_reply(9, 1'700'000'000'000'001));
  EXPECT_FALSE(n->out_of_memory());
  EXPECT_TRUE(n->answers());
  EXPECT_EQ(owner_.health_changes, 2);
}

TEST_F(NodeTest, CloseFailsWhatWaitsAndAnswersWhatIsInFlightAsLost) {
  node_ptr n = make();
  op_ptr waiting = check("a");  // no clock read yet: it waits for the handshake
  n->send(waiting, false);
  EXPECT_TRUE(wire_->sent().empty());
  wire_->handshake();
  ASSERT_EQ(wire_->sent().size(), 1u);
  op_ptr batched = check("b");
  n->send(batched, false);  // waits for the flush
  n->close();
  EXPECT_TRUE(wire_->closed());
  ASSERT_EQ(owner_.answers.size(), 1u);
  EXPECT_EQ(owner_.answers[0].o, waiting);
  EXPECT_EQ(owner_.answers[0].reply, "lost");
  EXPECT_EQ(owner_.failures, (std::vector<std::string>{"connection to 10.0.0.1:6379 closed"}));
  run();  // the flush posted before close sends nothing
  EXPECT_EQ(wire_->sent().size(), 1u);
  EXPECT_EQ(n->in_flight(), 0u);
  EXPECT_TRUE(n->idle_for(0s, steady::now()));
}

}  // namespace
}  // namespace sluice::detail
