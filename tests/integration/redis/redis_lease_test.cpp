// SPDX-License-Identifier: Apache-2.0
// Leases (rule::lease) against a real redis-server: two backends on one Redis are two instances.
// Nothing is admitted over the limit as the algorithm defines it, a cold key answers as an exact
// check, refusals are remembered for their retry_after, unused units are given back, a lost Redis
// leaves granted units usable, a rule change drops leases, the dual layer stays all or nothing.
// Time comes from a simulated clock shared by the scripts and the leases, so nothing sleeps.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "integration/redis/redis_server.hpp"
#include "support/prepared.hpp"
#include "sluice/memory_backend.hpp"
#include "sluice/redis_backend.hpp"
#include "sluice/testing/simulated_clock.hpp"

namespace sluice {
namespace {

using sluice::testing::prepared;

using namespace std::chrono_literals;
using testing::redis_server;

class RedisLeaseTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { redis_ = new redis_server(); }
  static void TearDownTestSuite() {
    delete redis_;
    redis_ = nullptr;
  }
  void SetUp() override { redis_->command({"FLUSHALL"}); }

  std::unique_ptr<redis_backend> make(redis_options o = {}, const redis_server* on = nullptr) {
    o.addresses = {(on ? on : redis_)->address()};
    o.clock_for_test = &clock_;
    o.command_timeout = 2s;
    auto b = make_redis_backend(o);
    EXPECT_TRUE(b.ok()) << (b.ok() ? "" : b.error().message);
    return std::move(b.value());
  }

  static prepared_rule_ptr prepare(backend& b, const rule& r) {
    auto p = b.prepare(r);
    EXPECT_TRUE(p.ok()) << (p.ok() ? "" : p.error().message);
    return p.ok() ? *p : nullptr;
  }

  static decision check(backend& b, const prepared_rule& p, std::string_view key, std::int64_t cost = 1) {
    check_request req{.rule = &p};
    req.key = key;
    req.cost = cost;
    auto d = b.check(req);
    EXPECT_TRUE(d.ok()) << (d.ok() ? "" : d.error().message);
    return d.ok() ? *d : decision{};
  }

  static rule leased(rule r, nanoseconds period = 200ms, double share = 0.1) {
    r.lease = lease_policy{.period = period, .max_share = share};
    return r;
  }

  // Two instances, A and B, of a rule `name` leasing a fixed window of `limit` a minute (a lease
  // period of 100 ms, half the limit at most), at the start of a window.
  struct instances {
    std::unique_ptr<redis_backend> a, b;
    prepared_rule_ptr pa, pb;
  };
  instances two_instances(const std::string& name, std::int64_t limit) {
    const rule r = leased({.name = name, .limit = fixed_window_policy(limit, 60s)}, 100ms, 0.5);
    instances out{make(), make(), nullptr, nullptr};
    out.pa = prepare(*out.a, r);
    out.pb = prepare(*out.b, r);
    clock_.set(time_point(std::chrono::hours(24 * 365 * 4)));
    return out;
  }

  static redis_server* redis_;
  sluice::testing::simulated_clock clock_{time_point(std::chrono::hours(24 * 365))};
};

redis_server* RedisLeaseTest::redis_ = nullptr;

TEST_F(RedisLeaseTest, AColdKeyAnswersExactlyAsAnExactCheck) {
  auto a = make();
  auto b = make();
  for (const policy& limit :
       {fixed_window_policy(10, 60s), sliding_window_counter_policy(10, 60s), token_bucket_policy(per_second(1), 10)}) {
    redis_->command({"FLUSHALL"});
    const rule exact{.name = "exact", .limit = limit};
    const rule lease = leased({.name = "leased", .limit = limit});
    auto pa = prepare(*a, lease);
    auto pb = prepare(*b, lease);
    auto pe = prepare(*a, exact);
    // One check per instance: each leases its cost alone, and reports what an exact check does.
    const decision first = check(*a, *pa, "k");
    const decision second = check(*b, *pb, "k");
    const decision e1 = check(*a, *pe, "k");
    const decision e2 = check(*a, *pe, "k");
    EXPECT_TRUE(first.allowed && second.allowed);
    EXPECT_EQ(first.remaining, e1.remaining) << to_string(limit.algorithm);
    EXPECT_EQ(second.remaining, e2.remaining) << to_string(limit.algorithm);
    EXPECT_EQ(first.remaining, 9);
    EXPECT_EQ(second.remaining, 8);
    EXPECT_EQ(first.limit, 10);
  }
}

// Checks on two instances at random moments; every admission is replayed, in time order, into the
// in-process limiter of the same rule, which must admit each one: nothing over the limit, as the
// algorithm defines it.
void expect_never_over_the_limit(RedisLeaseTest* t, redis_backend& a, redis_backend& b, testing::simulated_clock& clock,
                                 const rule& r, int steps, std::int64_t* admitted_out) {
  auto pa = a.prepare(r).value();
  auto pb = b.prepare(r).value();
  std::mt19937 rng(42);
  struct admission {
    time_point at;
    std::string key;
  };
  std::vector<admission> admitted;
  for (int i = 0; i < steps; ++i) {
    clock.advance(nanoseconds(std::uniform_int_distribution<std::int64_t>(0, 4'000'000)(rng)));
    const std::string key = "hot-" + std::to_string(rng() % 2);
    backend& on = rng() % 2 ? static_cast<backend&>(a) : b;
    const prepared_rule& p = &on == &a ? *pa : *pb;
    check_request req{.rule = &p};
    req.key = key;
    auto d = on.check(req);
    ASSERT_TRUE(d.ok()) << d.error().message;
    ASSERT_EQ(d->source, decision_source::limiter);
    if (d->allowed) admitted.push_back({clock.now(), key});
    if (i % 50 == 0) {
      a.give_back_leases();
      b.give_back_leases();
    }
  }
  (void)t;
  testing::simulated_clock replay_clock(admitted.empty() ? clock.now() : admitted.front().at);
  auto reference = make_memory_backend({.clock = &replay_clock}).value();
  rule exact = r;
  exact.lease.reset();
  auto in_process = prepared(*reference, exact);  // one state for the whole replay
  for (const admission& x : admitted) {
    replay_clock.set(x.at);
    auto d = reference->check({.rule = in_process.get(), .key = x.key});
    ASSERT_TRUE(d.ok());
    ASSERT_TRUE(d->allowed) << to_string(r.limit.algorithm) << ": admitted over the limit at " << to_ns(x.at) << " on "
                            << x.key;
  }
  *admitted_out = static_cast<std::int64_t>(admitted.size());
}

TEST_F(RedisLeaseTest, TwoInstancesNeverAdmitOverTheLimit) {
  for (const policy& limit : {fixed_window_policy(200, 1s), sliding_window_counter_policy(200, 1s),
                              token_bucket_policy(per_second(200), 40)}) {
    redis_->command({"FLUSHALL"});
    auto a = make();
    auto b = make();
    std::int64_t admitted = 0;
    // ~500 checks a second on two keys, for 2.5 s: each key over its limit about one check in two.
    expect_never_over_the_limit(this, *a, *b, clock_, leased({.name = "hot", .limit = limit}, 200ms, 0.25), 1250,
                                &admitted);
    // The demand exceeds the limit, so leases were taken and used (not one exact call per check).
    const redis_backend_stats sa = a->stats(), sb = b->stats();
    EXPECT_GT(admitted, 300) << to_string(limit.algorithm);
    EXPECT_LT(sa.calls + sb.calls, 1250u) << to_string(limit.algorithm);
  }
}

TEST_F(RedisLeaseTest, AWindowAdmitsItsLimitLessAtMostTheOtherInstancesLeases) {
  auto a = make();
  auto b = make();
  const rule r = leased({.name = "quota", .limit = fixed_window_policy(100, 10s)}, 200ms, 0.2);
  auto pa = prepare(*a, r);
  auto pb = prepare(*b, r);
  clock_.set(time_point(std::chrono::hours(24 * 365 * 2)));  // a window's start
  int admitted_a = 0, admitted_b = 0;
  for (int i = 0; i < 300; ++i) {
    clock_.advance(1ms);
    admitted_a += check(*a, *pa, "k").allowed;
    admitted_b += check(*b, *pb, "k").allowed;
  }
  // Both asked for more than the window holds: at most 100 together, and at least 100 less what
  // one instance can hold (max_share 0.2: 20 units), which the other one could not use.
  EXPECT_LE(admitted_a + admitted_b, 100);
  EXPECT_GE(admitted_a + admitted_b, 80);
  EXPECT_GT(admitted_a, 0);
  EXPECT_GT(admitted_b, 0);
  // Once the leases are returned nothing is stranded: the window is used up exactly.
  clock_.advance(300ms);
  a->give_back_leases();
  b->give_back_leases();
  for (int i = 0; i < 50; ++i) {
    clock_.advance(1ms);
    admitted_b += check(*b, *pb, "k").allowed;
  }
  EXPECT_EQ(admitted_a + admitted_b, 100);
}

TEST_F(RedisLeaseTest, ARefusedKeyIsRefusedLocallyUntilItsRetryAfter) {
  auto a = make();
  const rule r = leased({.name = "abuse", .limit = fixed_window_policy(5, 10s)});
  auto p = prepare(*a, r);
  clock_.set(time_point(std::chrono::hours(24 * 365 * 3)));
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(check(*a, *p, "client").allowed);
  const decision refused = check(*a, *p, "client");
  ASSERT_FALSE(refused.allowed);
  const std::uint64_t calls = a->stats().calls;
  // An abusive client at 429: no Redis call until the refusal's retry_after has passed.
  for (int i = 0; i < 1000; ++i) {
    const decision d = check(*a, *p, "client");
    EXPECT_FALSE(d.allowed);
    EXPECT_GT(d.retry_after, 0ns);
    EXPECT_LE(d.retry_after, refused.retry_after);
  }
  EXPECT_EQ(a->stats().calls, calls);
  clock_.advance(refused.retry_after);
  EXPECT_TRUE(check(*a, *p, "client").allowed);  // a new window
  EXPECT_EQ(a->stats().calls, calls + 1);
  std::string metrics;
  a->append_metrics(metrics);
  EXPECT_NE(metrics.find("sluice_lease_local_refusals_total{rule=\"abuse\"} 1000"), std::string::npos) << metrics;
}

TEST_F(RedisLeaseTest, GivenBackUnitsAreAdmittedOnTheOtherInstance) {
  auto [a, b, pa, pb] = two_instances("share", 100);
  // A busy key on A: its leases grow with its demand (up to 50 units).
  int admitted = 0;
  for (int i = 0; i < 60; ++i) admitted += check(*a, *pa, "k").allowed;
  EXPECT_EQ(admitted, 60);
  // B takes what is left in Redis while A still holds units: B's last admission says none remain.
  for (decision d = check(*b, *pb, "k"); d.allowed; d = check(*b, *pb, "k")) {
    ++admitted;
    if (d.remaining == 0) break;
  }
  EXPECT_LT(admitted, 100);
  // A's lease period ends; what it did not use goes back, and B is admitted for it.
  clock_.advance(150ms);
  a->give_back_leases();
  while (check(*b, *pb, "k").allowed) ++admitted;
  EXPECT_EQ(admitted, 100);
  std::string metrics;
  a->append_metrics(metrics);
  EXPECT_EQ(metrics.find("sluice_lease_units_returned_total{rule=\"share\"} 0"), std::string::npos) << metrics;
}

// A look at a leased rule reads Redis's state, where units leased out count as used, and takes no
// lease: another instance then has as much as before to lease.
TEST_F(RedisLeaseTest, ALookTakesNoLeaseAndCountsLeasedUnitsAsUsed) {
  auto [a, b, pa, pb] = two_instances("look", 100);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(check(*a, *pa, "k", 0).remaining, 100);
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(check(*a, *pa, "k").allowed);
  const decision seen = check(*b, *pb, "k", 0);
  EXPECT_TRUE(seen.allowed);
  EXPECT_LE(seen.remaining, 80) << "A's 20 checks, and what A leased beyond them";
  EXPECT_EQ(check(*b, *pb, "k", 0).remaining, seen.remaining) << "looks take nothing";
  std::string metrics;
  b->append_metrics(metrics);
  EXPECT_NE(metrics.find("sluice_lease_checks_total{rule=\"look\"} 0"), std::string::npos) << metrics;
}

// A reset forgets the key on Redis and the resetting instance's leases and refusal of it: both
// instances then see it full, and the leases it held do not come back on top.
TEST_F(RedisLeaseTest, AResetForgetsTheKeysLeases) {
  auto [a, b, pa, pb] = two_instances("reset", 10);
  int admitted = 0;
  while (check(*a, *pa, "k").allowed) ++admitted;
  ASSERT_EQ(admitted, 10);
  ASSERT_TRUE(a->reset({.rule = pa.get(), .key = "k"}).ok());
  EXPECT_EQ(check(*b, *pb, "k", 0).remaining, 10);
  admitted = 0;
  for (int i = 0; i < 30; ++i) admitted += check(*(i % 2 ? a : b), *(i % 2 ? pa : pb), "k").allowed;
  EXPECT_EQ(admitted, 10) << "the window's 10 again, and no more";
}

// A token bucket's unused leased units go back by moving its TAT back (x/time/rate's Cancel): the
// bucket is then as if only the used units had been taken.
TEST_F(RedisLeaseTest, ATokenBucketsUnusedUnitsMoveItsTatBack) {
  auto a = make();
  auto b = make();
  const rule r = leased({.name = "bucket", .limit = token_bucket_policy(per_second(10), 100)}, 100ms, 0.5);
  auto pa = prepare(*a, r);
  auto pb = prepare(*b, r);
  clock_.set(time_point(std::chrono::hours(24 * 365 * 8)));
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(check(*a, *pa, "k").allowed);
  // A's leases took more than the 40 it used; idle for a period, it gives them back.
  clock_.advance(150ms);
  a->give_back_leases();
  // 100 − 40 + 1.5 refilled, less B's own unit: 60 whole tokens left.
  EXPECT_EQ(check(*b, *pb, "k").remaining, 60);
  std::string metrics;
  a->append_metrics(metrics);
  EXPECT_EQ(metrics.find("sluice_lease_units_returned_total{rule=\"bucket\"} 0"), std::string::npos) << metrics;
}

TEST_F(RedisLeaseTest, LeasedUnitsOutliveRedisThenOnErrorDecides) {
  redis_server own;
  auto a = make({.on_error = failure_policy::deny}, &own);
  const rule r = leased({.name = "outage", .limit = fixed_window_policy(1000, 60s)}, 1s, 0.1);
  auto p = prepare(*a, r);
  clock_.set(time_point(std::chrono::hours(24 * 365 * 5)));
  for (int i = 0; i < 150; ++i) ASSERT_TRUE(check(*a, *p, "k").allowed);  // leases up to 100 units
  own.kill();
  // Units already leased were granted: they are still used, then on_error decides.
  int from_lease = 0;
  decision d;
  for (int i = 0; i < 200; ++i) {
    d = check(*a, *p, "k");
    if (d.source != decision_source::limiter) break;
    EXPECT_TRUE(d.allowed);
    ++from_lease;
  }
  EXPECT_GT(from_lease, 0);
  EXPECT_LE(from_lease, 100);
  EXPECT_EQ(d.source, decision_source::fail_closed);
}

TEST_F(RedisLeaseTest, ARuleChangeDropsItsLeasesAndRefusals) {
  auto a = make();
  clock_.set(time_point(std::chrono::hours(24 * 365 * 6)));
  const rule v1 = leased({.name = "plan", .limit = fixed_window_policy(10, 60s)}, 1s, 0.5);
  auto p1 = prepare(*a, v1);
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(check(*a, *p1, "k").allowed);
  EXPECT_FALSE(check(*a, *p1, "k").allowed);  // remembered for the window's rest
  // A raised limit: the new definition asks Redis, which admits at once.
  rule v2 = v1;
  v2.limit.limit = 20;
  auto p2 = prepare(*a, v2);
  EXPECT_TRUE(check(*a, *p2, "k").allowed);
  // Units still leased by a dropped definition are given back.
  const rule other = leased({.name = "drop", .limit = fixed_window_policy(100, 60s)}, 1s, 0.5);
  auto p3 = prepare(*a, other);
  for (int i = 0; i < 30; ++i) EXPECT_TRUE(check(*a, *p3, "k").allowed);
  p3.reset();
  a->give_back_leases();  // waits for what is in flight on the connection, the give-back included
  auto p4 = prepare(*a, other);
  decision d = check(*a, *p4, "k");
  EXPECT_EQ(d.remaining, 100 - 31);
}

TEST_F(RedisLeaseTest, ALeasedTenantLayerStaysAllOrNothing) {
  auto a = make();
  clock_.set(time_point(std::chrono::hours(24 * 365 * 7)));
  rule r{.name = "tenants", .limit = fixed_window_policy(3, 60s), .tenant = fixed_window_policy(100, 60s)};
  r.lease = lease_policy{.period = 1s, .max_share = 0.5};
  auto p = prepare(*a, r);
  int admitted = 0;
  for (int user = 0; user < 4; ++user) {
    for (int i = 0; i < 6; ++i) {
      check_request req{.rule = p.get()};
      req.tenant = "acme";
      const std::string id = "u" + std::to_string(user);
      req.user = id;
      auto d = a->check(req);
      ASSERT_TRUE(d.ok()) << d.error().message;
      EXPECT_EQ(d->allowed, i < 3);
      if (!d->allowed) {
        EXPECT_EQ(d->rejected_by, layer::user);
      }
      admitted += d->allowed;
    }
  }
  EXPECT_EQ(admitted, 12);
  // Dropping the rule gives its tenant lease back: the tenant counted exactly the 12 admitted, none
  // of the 12 its users refused.
  p.reset();
  a->give_back_leases();
  rule exact = r;
  exact.lease.reset();
  auto d = a->check({.rule = prepared(*a, exact).get(), .tenant = "acme", .user = "someone-else"});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->tenant.remaining, 100 - 12 - 1);
}

TEST_F(RedisLeaseTest, ALogCannotBeLeased) {
  auto a = make();
  const rule r = leased({.name = "log", .limit = sliding_window_policy(10, 60s)});
  auto p = a->prepare(r);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error().message.find("cannot be leased"), std::string::npos) << p.error().message;
}

}  // namespace
}  // namespace sluice
