// SPDX-License-Identifier: Apache-2.0
// The Redis backend on a Sentinel-managed master, against real servers on 127.0.0.1: one master,
// two replicas and three sentinels (redis-server in its Sentinel mode). The master is found through
// the sentinels (past one that is down), its ROLE confirmed; a SENTINEL FAILOVER and a SIGKILL of
// the master are followed under load from two instances; a sentinel that names a replica, a
// closed port or itself never gets a write sent there.
//
// The failover tests print what an operator plans with: checks failed during the switch (refused
// by on_error = deny), the time until checks succeed again, and the admissions the new master does
// not count (replication is asynchronous). Their loops are bounded and end by themselves; they wait
// for the servers, never for a limiter.
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "integration/redis/redis_server.hpp"
#include "integration/redis/scripted_server.hpp"
#include "sluice/redis_backend.hpp"
#include "support/log_capture.hpp"
#include "support/prepared.hpp"

namespace sluice {
namespace {

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;
using testing::log_capture;
using testing::prepared;
using testing::redis_server;
using testing::scripted_server;

const std::string master_name = "mymaster";

// Polls `done` every 50 ms until it holds or `limit` passes (the servers' own timers: replication,
// the sentinels' hellos and failovers).
template <class F>
bool eventually(F done, std::chrono::milliseconds limit = 20s) {
  const auto until = steady::now() + limit;
  while (steady::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return done();
}

std::string field(const std::string& info, const std::string& name) {
  const auto at = info.find(name + ":");
  if (at == std::string::npos) return {};
  const auto from = at + name.size() + 1;
  return info.substr(from, info.find("\r\n", from) - from);
}

// One master, two replicas and three sentinels watching it with a quorum of two.
class sentinel_group {
 public:
  sentinel_group() {
    // A full sync at once (the default waits 5 s for more replicas), by any server once master.
    const std::vector<std::string> sync_now{"--repl-diskless-sync-delay", "0"};
    servers_.push_back(std::make_unique<redis_server>(sync_now));
    for (int i = 0; i < 2; ++i) {
      auto args = sync_now;
      args.insert(args.end(), {"--replicaof", "127.0.0.1", std::to_string(servers_[0]->port())});
      servers_.push_back(std::make_unique<redis_server>(args));
    }
    for (int i = 1; i < 3; ++i) {
      if (!eventually([&] {
            return field(servers_[i]->string({"INFO", "replication"}), "master_link_status") == "up";
          })) {
        throw std::runtime_error("a replica did not sync");
      }
    }
    const std::string config = "sentinel monitor " + master_name + " 127.0.0.1 " + std::to_string(servers_[0]->port()) +
                               " 2\nsentinel down-after-milliseconds " + master_name +
                               " 1000\nsentinel failover-timeout " + master_name + " 10000\n";
    for (int i = 0; i < 3; ++i) {
      sentinels_.push_back(std::make_unique<redis_server>(std::vector<std::string>{"--sentinel"}, nullptr, config));
    }
    // A failover needs the sentinels to know each other (their hellos, every 2 s) and the replicas.
    for (auto& s : sentinels_) {
      if (!eventually([&] {
            auto r = s->command({"SENTINEL", "MASTER", master_name});
            std::string others, replicas;
            for (std::size_t k = 0; r->type == REDIS_REPLY_ARRAY && k + 1 < r->elements; k += 2) {
              const std::string key(r->element[k]->str, r->element[k]->len);
              const std::string value(r->element[k + 1]->str, r->element[k + 1]->len);
              if (key == "num-other-sentinels") others = value;
              if (key == "num-slaves") replicas = value;
            }
            return others == "2" && replicas == "2";
          })) {
        throw std::runtime_error("the sentinels did not find each other and the replicas");
      }
    }
  }

  std::vector<std::string> sentinel_addresses() const {
    std::vector<std::string> out;
    for (const auto& s : sentinels_) out.push_back(s->address());
    return out;
  }
  redis_server& sentinel(std::size_t i) { return *sentinels_[i]; }
  redis_server& server(std::size_t i) { return *servers_[i]; }
  redis_server& first_master() { return *servers_[0]; }

  // A client is subscribed on one of the sentinels: +switch-master (sentinels subscribe to nothing
  // on each other).
  bool has_subscriber() {
    for (auto& s : sentinels_) {
      if (s->string({"CLIENT", "LIST"}).find(" sub=1 ") != std::string::npos) return true;
    }
    return false;
  }

  // The server the sentinels name as master now, if they agree on one of ours.
  redis_server* named_master() {
    auto r = sentinels_[0]->command({"SENTINEL", "GET-MASTER-ADDR-BY-NAME", master_name});
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2) return nullptr;
    const int port = std::stoi(std::string(r->element[1]->str, r->element[1]->len));
    for (auto& s : servers_) {
      if (s->port() == port) return s.get();
    }
    return nullptr;
  }

 private:
  std::vector<std::unique_ptr<redis_server>> servers_;  // [0]: the first master
  std::vector<std::unique_ptr<redis_server>> sentinels_;
};

redis_options sentinel_options(std::vector<std::string> sentinels) {
  return {.addresses = std::move(sentinels),
          .master_name = master_name,
          .connect_timeout = 500ms,
          .command_timeout = 500ms,
          .on_error = failure_policy::deny,
          .breaker_probe_interval = 50ms,
          .error_log_interval = 10ms};
}

const rule three_per_minute{.name = "sentinel", .limit = fixed_window_policy(3, 60s)};

// Four checks on a fresh key: three admitted by Redis, the fourth refused.
void expect_decided_by_redis(backend& b, const std::string& key) {
  auto r = prepared(b, three_per_minute);
  for (int i = 0; i < 4; ++i) {
    auto d = b.check({.rule = r.get(), .key = key});
    ASSERT_TRUE(d) << d.error().message;
    EXPECT_EQ(d->source, decision_source::limiter) << i;
    EXPECT_EQ(d->allowed, i < 3) << i;
  }
}

TEST(RedisSentinelTest, FindsTheMasterPastADownSentinelAndDecidesThere) {
  sentinel_group group;
  std::vector<std::string> sentinels;
  for (std::size_t i = 0; i < 3; ++i) {
    sentinels.push_back("localhost:" + std::to_string(group.sentinel(i).port()));  // asked once resolved
  }
  sentinels.insert(sentinels.begin(), "127.0.0.1:" + std::to_string(testing::free_port()));  // nobody there
  auto b = make_redis_sentinel_backend(sentinel_options(sentinels));
  ASSERT_TRUE(b) << b.error().message;
  ASSERT_TRUE(eventually([&] { return (*b)->ready(); }, 10s));
  expect_decided_by_redis(**b, "u1");
  EXPECT_FALSE(group.first_master().keys().empty());  // written on the master
  EXPECT_TRUE(eventually([&] { return group.has_subscriber(); }, 5s));
  EXPECT_EQ((*b)->stats().master_switches, 0u);
}

TEST(RedisSentinelTest, SentinelAuthIsItsOwn) {
  // The sentinels ask for a password of their own; the master has none.
  sentinel_group group;
  for (std::size_t i = 0; i < 3; ++i) group.sentinel(i).command({"ACL", "SETUSER", "default", "resetpass", ">s3cret"});
  for (std::size_t i = 0; i < 3; ++i) group.sentinel(i).set_password("", "s3cret");
  {
    log_capture log;
    auto b = make_redis_sentinel_backend(sentinel_options(group.sentinel_addresses()));
    ASSERT_TRUE(b);
    EXPECT_TRUE(eventually([&] { return log.text().find("event=redis_no_master") != std::string::npos; }, 5s))
        << log.text();
    EXPECT_NE(log.text().find("AUTH"), std::string::npos) << log.text();  // NOAUTH, for the operator
    EXPECT_FALSE((*b)->ready());
  }
  auto o = sentinel_options(group.sentinel_addresses());
  o.sentinel_password = "s3cret";
  auto b = make_redis_sentinel_backend(o);
  ASSERT_TRUE(b);
  ASSERT_TRUE(eventually([&] { return (*b)->ready(); }, 10s));
  expect_decided_by_redis(**b, "u2");
}

// The ACLs the README documents: on the master, the one-Redis user and ROLE; on the sentinels, a
// user that may only ask where the master is and hear of switches. Without ROLE, the log says so.
TEST(RedisSentinelTest, TheMinimalAclsOnTheMasterAndTheSentinelsAreEnough) {
  sentinel_group group;
  auto acl = [](redis_server& s, const std::string& rules) {
    std::vector<std::string> words = {"ACL", "SETUSER"};
    std::istringstream in(rules);
    for (std::string w; in >> w;) words.push_back(w);
    auto r = s.command(words);
    ASSERT_EQ(r->type, REDIS_REPLY_STATUS) << rules;
  };
  const std::string one_redis =
      "on >pw resetkeys ~sluice:* resetchannels -@all +evalsha +eval +script|load +time +ping +get +set +del "
      "+pexpire +setrange +zadd +zincrby +zrange +zrangebyscore +zremrangebyrank";
  acl(group.first_master(), "sluice " + one_redis + " +role");
  acl(group.first_master(), "norole " + one_redis);
  for (std::size_t i = 0; i < 3; ++i) {
    acl(group.sentinel(i),
        "watcher on >spw resetchannels &+switch-master -@all +sentinel|get-master-addr-by-name "
        "+subscribe +ping");
  }
  auto o = sentinel_options(group.sentinel_addresses());
  o.username = "sluice";
  o.password = "pw";
  o.sentinel_username = "watcher";
  o.sentinel_password = "spw";
  auto b = make_redis_sentinel_backend(o);
  ASSERT_TRUE(b) << b.error().message;
  ASSERT_TRUE(eventually([&] { return (*b)->ready(); }, 10s));
  expect_decided_by_redis(**b, "acl");
  EXPECT_TRUE(eventually([&] { return group.has_subscriber(); }, 5s));

  log_capture log;
  o.username = "norole";
  auto without = make_redis_sentinel_backend(o);
  ASSERT_TRUE(without);
  EXPECT_TRUE(eventually([&] { return log.text().find("ROLE failed on") != std::string::npos; }, 5s)) << log.text();
  EXPECT_NE(log.text().find("NOPERM"), std::string::npos) << log.text();
  EXPECT_FALSE((*without)->ready());
}

TEST(RedisSentinelTest, AnUnknownMasterNameIsNamedAndChecksFollowOnError) {
  sentinel_group group;
  log_capture log;
  auto o = sentinel_options(group.sentinel_addresses());
  o.master_name = "nosuchmaster";
  auto b = make_redis_sentinel_backend(o);
  ASSERT_TRUE(b);
  ASSERT_TRUE(eventually([&] { return log.text().find("event=redis_no_master") != std::string::npos; }, 5s));
  EXPECT_NE(log.text().find("does not know the master's name"), std::string::npos) << log.text();
  EXPECT_FALSE((*b)->ready());
  auto r = prepared(**b, three_per_minute);
  auto d = (*b)->check({.rule = r.get(), .key = "k"});
  ASSERT_TRUE(d);
  EXPECT_FALSE(d->allowed);
  EXPECT_EQ(d->source, decision_source::fail_closed);
}

TEST(RedisSentinelTest, OptionsAreChecked) {
  auto o = sentinel_options({"127.0.0.1:26379"});
  o.master_name = "";
  EXPECT_FALSE(make_redis_sentinel_backend(o));
  o.master_name = "two words";
  EXPECT_FALSE(make_redis_sentinel_backend(o));
  o.master_name = master_name;
  o.sentinel_username = "watcher";
  auto b = make_redis_sentinel_backend(o);
  ASSERT_FALSE(b);
  EXPECT_NE(b.error().message.find("sentinel_password"), std::string::npos) << b.error().message;
}

// A lying sentinel names 127.0.0.1:`port` (0: its own) as the master. The backend must not become
// ready, and nothing may be written there: a replica given here takes writes (replica-read-only
// no), so only ROLE keeps the checks away.
void expect_never_written(int port, redis_server* target, const std::string& reason) {
  std::atomic<int> named{port};
  scripted_server liar([&](const std::vector<std::string>& c) -> std::string {
    if (c.front() == "PING") return "+PONG\r\n";
    if (c.front() == "SENTINEL") {
      const std::string p = std::to_string(named.load());
      return "*2\r\n$9\r\n127.0.0.1\r\n$" + std::to_string(p.size()) + "\r\n" + p + "\r\n";
    }
    if (c.front() == "SUBSCRIBE") return "*3\r\n$9\r\nsubscribe\r\n$14\r\n+switch-master\r\n:1\r\n";
    if (c.front() == "ROLE") return "*2\r\n$8\r\nsentinel\r\n*1\r\n$8\r\nmymaster\r\n";
    return "+OK\r\n";
  });
  if (port == 0) named = liar.port();
  log_capture log;
  auto b = make_redis_sentinel_backend(sentinel_options({liar.address()}));
  ASSERT_TRUE(b);
  auto r = prepared(**b, three_per_minute);
  for (int i = 0; i < 20; ++i) {
    auto d = (*b)->check({.rule = r.get(), .key = "k" + std::to_string(i)});
    ASSERT_TRUE(d);
    EXPECT_EQ(d->source, decision_source::fail_closed);
  }
  EXPECT_TRUE(eventually([&] { return log.text().find(reason) != std::string::npos; }, 5s)) << log.text();
  EXPECT_FALSE((*b)->ready());
  if (target != nullptr) {
    EXPECT_TRUE(target->keys().empty());
  }
}

TEST(RedisSentinelTest, ASentinelNamingAReplicaGetsNoWriteSentThere) {
  redis_server master;
  redis_server replica({"--replicaof", "127.0.0.1", std::to_string(master.port()), "--replica-read-only", "no"});
  ASSERT_TRUE(eventually([&] { return field(replica.string({"INFO", "replication"}), "master_link_status") == "up"; }));
  // In the log the reason is a quoted field: its quotes escaped.
  expect_never_written(replica.port(), &replica, replica.address() + R"( is not a master (ROLE says \"slave\"))");
}

TEST(RedisSentinelTest, ASentinelNamingAClosedPortLeavesTheBackendNotReady) {
  const int closed = testing::free_port();
  expect_never_written(closed, nullptr, "cannot connect to 127.0.0.1:" + std::to_string(closed));
}

TEST(RedisSentinelTest, ASentinelNamingItselfIsNoMaster) {
  // Its ROLE says "sentinel".
  expect_never_written(0, nullptr, R"(is not a master (ROLE says \"sentinel\"))");
}

// Two instances check one key under a limit too high to reach, each as fast as it can, while
// `make_switch` moves the master; they stop once both have been decided by the new master for
// 500 ms (or after 30 s). Prints the figures the README gives.
struct switch_figures {
  long long admitted = 0;  // by Redis
  long long failed = 0;    // refused by on_error during the switch
  double recovery_s = 0;   // from the switch's start to the first check the new master decided
  long long counted = 0;   // the admissions the new master holds
};

template <class F>
switch_figures checks_across_a_switch(sentinel_group& group, F make_switch, int wait_replicas = 0) {
  // "lost" is admitted - counted: admissions the new master does not hold (negative: checks
  // refused by on_error that had written, their reply lost or their WAIT short).
  const rule limit{.name = "across", .limit = sliding_window_policy(100'000'000, 3600s)};
  redis_server& old_master = *group.named_master();
  std::vector<std::unique_ptr<redis_backend>> instances;
  std::vector<prepared_rule_ptr> rules;
  for (int i = 0; i < 2; ++i) {
    auto o = sentinel_options(group.sentinel_addresses());
    o.wait_replicas = wait_replicas;
    auto b = make_redis_sentinel_backend(o);
    if (!b) throw std::runtime_error(b.error().message);
    instances.push_back(std::move(*b));
    rules.push_back(prepared(*instances.back(), limit));
  }
  for (auto& b : instances) {
    if (!eventually([&] { return b->ready(); }, 10s)) throw std::runtime_error("no master found");
  }
  std::atomic<bool> switched{false}, stop{false};
  std::atomic<long long> admitted{0}, failed{0};
  std::atomic<std::int64_t> first_new_ns{0};
  steady::time_point switch_started;
  std::vector<std::thread> load;
  for (int i = 0; i < 2; ++i) {
    load.emplace_back([&, i] {
      const auto until = steady::now() + 30s;
      steady::time_point decided_since{};
      while (!stop && steady::now() < until) {
        auto d = instances[i]->check({.rule = rules[i].get(), .key = "shared"});
        if (!d || d->source != decision_source::limiter) {
          failed.fetch_add(1);
          decided_since = {};
          continue;
        }
        if (d->allowed) admitted.fetch_add(1);
        if (!switched || instances[i]->stats().master_switches == 0) continue;
        const auto now = steady::now();
        std::int64_t expected = 0;
        first_new_ns.compare_exchange_strong(expected, (now - switch_started).count());
        if (decided_since == steady::time_point{}) decided_since = now;
        if (now - decided_since > 500ms && instances[1 - i]->stats().master_switches > 0) stop = true;
      }
    });
  }
  std::this_thread::sleep_for(300ms);  // load on the old master first
  switch_started = steady::now();
  switched = true;
  make_switch(old_master);
  for (auto& t : load) t.join();
  for (std::size_t i = 0; i < 3; ++i) {
    if (&group.server(i) != &old_master) group.server(i).reconnect();  // the sentinels killed the clients
  }
  switch_figures f;
  f.admitted = admitted.load();
  f.failed = failed.load();
  f.recovery_s = std::chrono::duration<double>(std::chrono::nanoseconds(first_new_ns.load())).count();
  redis_server* now_master = group.named_master();
  if (now_master == nullptr || now_master == &old_master) throw std::runtime_error("the master did not move");
  for (const std::string& key : now_master->keys()) f.counted += now_master->log_units(key);
  std::cout << "switch (wait_replicas = " << wait_replicas << "): " << f.failed
            << " checks failed, decided again after " << f.recovery_s << " s; " << f.admitted << " admitted, "
            << f.counted << " counted by the new master (" << f.admitted - f.counted << " lost with the old one)\n";
  EXPECT_GT(f.recovery_s, 0);
  // At least once: a sentinel that has not heard of the switch yet may name the old master, which
  // ROLE then refuses.
  for (auto& b : instances) EXPECT_GE(b->stats().master_switches, 1u);
  EXPECT_GT(f.counted, 0);
  return f;
}

TEST(RedisSentinelTest, FollowsASentinelFailoverUnderLoad) {
  sentinel_group group;
  checks_across_a_switch(group, [&](redis_server&) {
    auto r = group.sentinel(1).command({"SENTINEL", "FAILOVER", master_name});
    ASSERT_EQ(r->type, REDIS_REPLY_STATUS) << std::string(r->str, r->len);
  });
}

TEST(RedisSentinelTest, WithWaitReplicasNoAdmissionIsLostInAFailover) {
  // Each admission is on both replicas before it is answered: the one promoted has them all.
  sentinel_group group;
  auto f = checks_across_a_switch(
      group,
      [&](redis_server&) {
        auto r = group.sentinel(1).command({"SENTINEL", "FAILOVER", master_name});
        ASSERT_EQ(r->type, REDIS_REPLY_STATUS) << std::string(r->str, r->len);
      },
      2);
  // (It may count more: a check refused for want of replicas, or whose reply was lost, has written.)
  EXPECT_GE(f.counted, f.admitted);
}

TEST(RedisSentinelTest, FollowsTheMasterKilledUnderLoad) {
  sentinel_group group;
  checks_across_a_switch(group, [](redis_server& old_master) { old_master.kill(); });
}

}  // namespace
}  // namespace sluice
