// SPDX-License-Identifier: Apache-2.0
// The Redis backend against a real redis-server: every script gives the decisions of the in-process
// backend, keys are encoded safely and always expire, dual-layer checks are all or nothing, scripts
// come back after SCRIPT FLUSH, AUTH works. Time comes from a simulated clock passed to the scripts
// (redis_options::clock_for_test), so nothing sleeps.
#include "sluice/redis_backend.hpp"
#include "sluice/limiter_state.hpp"

#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <cmath>
#include <filesystem>
#include <functional>
#include <future>
#include <optional>
#include <thread>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include "integration/redis/redis_server.hpp"
#include "support/prepared.hpp"
#include "redis/keys.hpp"
#include "sluice/asio.hpp"
#include "sluice/memory_backend.hpp"
#include "sluice/testing/simulated_clock.hpp"
#include "unit/keyed/check_all_cases.hpp"
#include "unit/keyed/look_cases.hpp"
#include "unit/keyed/reset_cases.hpp"

namespace sluice {
namespace {

using sluice::testing::prepared;

namespace asio = boost::asio;
using namespace std::chrono_literals;
using testing::redis_server;

class RedisBackendTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { redis_ = new redis_server(); }
  static void TearDownTestSuite() {
    delete redis_;
    redis_ = nullptr;
  }

  void SetUp() override { redis_->command({"FLUSHALL"}); }

  std::unique_ptr<redis_backend> make(redis_options o = {}) {
    o.addresses = {redis_->address()};
    o.clock_for_test = &clock_;
    o.command_timeout = 2s;  // sanitizer builds are slow; the timeout path has its own tests
    auto b = make_redis_backend(o);
    EXPECT_TRUE(b.ok()) << (b.ok() ? "" : b.error().message);
    return std::move(b.value());
  }

  static redis_server* redis_;
  sluice::testing::simulated_clock clock_{time_point(std::chrono::hours(24 * 365))};
};

redis_server* RedisBackendTest::redis_ = nullptr;

// Redis Cluster hashes only the part between the first '{' and the next '}' (when not empty).
std::string hash_tag(const std::string& key) {
  auto open = key.find('{');
  auto close = open == std::string::npos ? std::string::npos : key.find('}', open + 1);
  if (close == std::string::npos || close == open + 1) return key;
  return key.substr(open + 1, close - open - 1);
}

decision expect_decision(result<decision> r) {
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? r.value() : decision{};
}

void expect_same(const decision& redis, const decision& memory, const std::string& where) {
  // Redis works in whole microseconds: durations may differ by the rounding of one µs.
  auto close = [](nanoseconds a, nanoseconds b) {
    if (a == never || b == never) return a == b;
    return std::chrono::abs(a - b) <= 1us;
  };
  EXPECT_EQ(redis.allowed, memory.allowed) << where;
  EXPECT_EQ(redis.limit, memory.limit) << where;
  EXPECT_EQ(redis.remaining, memory.remaining) << where;
  EXPECT_TRUE(close(redis.retry_after, memory.retry_after))
      << where << " retry_after redis " << redis.retry_after.count() << " memory " << memory.retry_after.count();
  EXPECT_TRUE(close(redis.reset_after, memory.reset_after))
      << where << " reset_after redis " << redis.reset_after.count() << " memory " << memory.reset_after.count();
  EXPECT_EQ(redis.dual_layer, memory.dual_layer) << where;
  EXPECT_EQ(redis.rejected_by, memory.rejected_by) << where;
  EXPECT_EQ(redis.binding, memory.binding) << where;
  EXPECT_EQ(redis.tenant.limit, memory.tenant.limit) << where;
  EXPECT_EQ(redis.tenant.remaining, memory.tenant.remaining) << where;
  EXPECT_EQ(redis.user.limit, memory.user.limit) << where;
  EXPECT_EQ(redis.user.remaining, memory.user.remaining) << where;
  EXPECT_EQ(redis.source, decision_source::limiter) << where;
}

// A random walk of time and costs, checked on Redis and in process with the same clock: every
// decision must match. With `prime` > 0, every key first takes that cost (on both backends).
void compare_with_memory(redis_backend& redis, testing::simulated_clock& clock, const rule& r, nanoseconds max_step,
                         std::int64_t prime = 0) {
  auto memory = make_memory_backend({.clock = &clock}).value();
  auto on_redis = prepared(redis, r);
  auto on_memory = prepared(*memory, r);
  // The same request on both backends, each with its own prepared rule.
  auto both = [&](check_request req) {
    req.rule = on_redis.get();
    decision dr = expect_decision(redis.check(req));
    req.rule = on_memory.get();
    return std::pair{dr, expect_decision(memory->check(req))};
  };
  std::mt19937 rng(42);
  std::uniform_int_distribution<std::int64_t> step(0, max_step.count() / 1000);
  const std::int64_t max_cost =
      std::min<std::int64_t>(3, std::min(r.limit.capacity(), r.tenant ? r.tenant->capacity() : 3));
  std::uniform_int_distribution<std::int64_t> cost(0, max_cost);  // 0: a look
  const std::string keys[] = {"alice", "bob"};
  const std::string tenants[] = {"acme", "globex"};
  for (const auto& t : tenants) {
    for (const auto& k : keys) {
      if (prime == 0) break;
      auto [dr, dm] = both({.key = k, .tenant = t, .user = k, .cost = prime});
      expect_same(dr, dm, r.name + " prime");
    }
  }
  int allowed = 0;
  int refused = 0;
  for (int i = 0; i < 300; ++i) {
    // Mostly bursts at one instant, sometimes a pause.
    if (rng() % 3 == 0) clock.advance(std::chrono::microseconds(step(rng)));
    auto [dr, dm] =
        both({.key = keys[rng() % 2], .tenant = tenants[rng() % 2], .user = keys[rng() % 2], .cost = cost(rng)});
    expect_same(dr, dm, r.name + " step " + std::to_string(i));
    (dr.allowed ? allowed : refused)++;
    if (::testing::Test::HasFailure()) return;
  }
  // The walk exercised both outcomes.
  EXPECT_GT(allowed, 10) << r.name;
  EXPECT_GT(refused, 10) << r.name;
}

TEST_F(RedisBackendTest, CheckAllIsAllOrNothing) {
  auto b = make();
  testing::expect_check_all_semantics(*b, clock_);
}

TEST_F(RedisBackendTest, ALookAnswersAsOneUnitAndRecordsNothing) {
  auto b = make();
  testing::expect_look_semantics(*b, clock_);
}

TEST_F(RedisBackendTest, AResetKeyStartsAgainFull) {
  auto b = make();
  testing::expect_reset_semantics(*b);
  // Redis down: the reset is an error, whatever on_error says (nothing is known to be forgotten).
  redis_server other;
  auto gone = make_redis_backend({.addresses = {other.address()}, .command_timeout = 300ms}).value();
  auto q = prepared(*gone, {.name = "reset_down", .limit = fixed_window_policy(1, 60s)});
  other.kill();
  EXPECT_TRUE(gone->check({.rule = q.get(), .key = "k"}).value().allowed) << "on_error = allow";
  EXPECT_FALSE(gone->reset({.rule = q.get(), .key = "k"}).ok());
}

TEST_F(RedisBackendTest, TokenBucketMatchesInProcess) {
  auto b = make();
  rule r{.name = "tb", .limit = token_bucket_policy(per_second(10), 5)};
  compare_with_memory(*b, clock_, r, 400ms);
}

// The token-bucket parity cases (tests/differential) that apply to the script, against the
// in-process algorithm itself (gcra_state: the state the script keeps, the TAT alone): rates from
// 1e-6/s to the Redis maximum of 1e6/s (intervals neither multiples of 4 ns nor of 1 µs), an
// infinite rate, bursts 0 to 2,000,000, costs up to a third of the burst, time standing still and
// going back. (Not against the memory backend here: its table drops an idle entry, which a clock
// stepping back past the entry's idle time would have found in debt.) A Redis key expires in real
// time when its bucket would be full, while the test's clock is simulated: the fast buckets are
// primed with a debt of over a second so that no key expires during the walk.
TEST_F(RedisBackendTest, TokenBucketScriptMatchesTheAlgorithmAcrossRatesBurstsAndTimeGoingBack) {
  auto b = make();
  struct walk_case {
    rate r;
    std::int64_t burst;
    std::int64_t prime;  // cost taken first by each key
    std::int64_t max_step_us;
  };
  const walk_case cases[] = {
      {per_second(1e-6), 3, 0, 10'000'000},
      {per_second(0.5), 1, 0, 3'000'000},
      {per_second(7), 10'000, 0, 200'000},
      {per_second(333'333), 1'000'000, 800'000, 200'000},
      {per_second(1e6), 2'000'000, 1'500'000, 300'000},
      {rate::infinite(), 5, 0, 1'000},
      {per_second(3), 0, 0, 1'000'000},
  };
  std::mt19937 rng(9);
  int n = 0;
  for (const walk_case& c : cases) {
    const rule r{.name = "tb" + std::to_string(n++), .limit = token_bucket_policy(c.r, c.burst)};
    const gcra_params p = make_gcra_params(c.r, c.burst);
    std::map<std::string, gcra_state> states;
    std::uniform_int_distribution<std::int64_t> step(0, c.max_step_us);
    std::uniform_int_distribution<std::int64_t> cost(0, std::max<std::int64_t>(1, c.burst / 3));  // 0: a look
    int allowed = 0;
    for (const std::string key : {"alice", "bob"}) {
      if (c.prime == 0) break;
      expect_same(expect_decision(b->check({.rule = prepared(*b, r).get(), .key = key, .cost = c.prime})),
                  check_and_commit(states[key], p, to_ns(clock_.now()), c.prime), r.name + " prime");
    }
    for (int i = 0; i < 300; ++i) {
      const auto roll = rng() % 8;
      if (roll == 0) {
        clock_.set(clock_.now() - std::chrono::microseconds(step(rng)));  // time going back
      } else if (roll < 4) {
        clock_.advance(std::chrono::microseconds(step(rng)));
      }  // else: time standing still
      const std::string key = rng() % 2 ? "alice" : "bob";
      const std::int64_t c_cost = cost(rng);
      const decision dr = expect_decision(b->check({.rule = prepared(*b, r).get(), .key = key, .cost = c_cost}));
      const decision dm = check_and_commit(states[key], p, to_ns(clock_.now()), c_cost);
      expect_same(dr, dm, r.name + " step " + std::to_string(i));
      allowed += dr.allowed;
      if (HasFailure()) return;
    }
    if (c.burst == 0) {
      EXPECT_EQ(allowed, 0) << r.name;
    } else if (c.r.is_infinite()) {
      EXPECT_EQ(allowed, 300) << r.name;
    } else {
      EXPECT_LT(allowed, 300) << r.name << ": the walk met refusals";
    }
  }
}

TEST_F(RedisBackendTest, SlidingWindowLogMatchesInProcess) {
  auto b = make();
  rule r{.name = "swl", .limit = sliding_window_policy(6, 1s)};
  compare_with_memory(*b, clock_, r, 300ms);
}

TEST_F(RedisBackendTest, SlidingWindowCounterMatchesInProcess) {
  auto b = make();
  rule r{.name = "swc", .limit = sliding_window_counter_policy(8, 1s)};
  compare_with_memory(*b, clock_, r, 300ms);
}

TEST_F(RedisBackendTest, FixedWindowMatchesInProcess) {
  auto b = make();
  rule r{.name = "fw", .limit = fixed_window_policy(7, 1s)};
  compare_with_memory(*b, clock_, r, 300ms);
}

// Calendar windows over many month, week and day ends (1971-1972: a leap February included): the
// script finds the same UTC periods as the in-process state.
TEST_F(RedisBackendTest, CalendarWindowsMatchInProcess) {
  auto b = make();
  compare_with_memory(*b, clock_, {.name = "month", .limit = calendar_window_policy(7, calendar::month)}, 240h);
  compare_with_memory(*b, clock_, {.name = "week", .limit = calendar_window_policy(7, calendar::week)}, 60h);
  compare_with_memory(*b, clock_, {.name = "day", .limit = calendar_window_policy(7, calendar::day)}, 9h);
  compare_with_memory(*b, clock_,
                      {.name = "dual_month",
                       .limit = fixed_window_policy(4, 24h),
                       .tenant = calendar_window_policy(9, calendar::month)},
                      240h);
}

TEST_F(RedisBackendTest, DualLayerMatchesInProcess) {
  auto b = make();
  rule both_logs{.name = "dual", .limit = sliding_window_policy(4, 1s), .tenant = sliding_window_policy(6, 1s)};
  compare_with_memory(*b, clock_, both_logs, 300ms);
  rule mixed{.name = "mixed", .limit = token_bucket_policy(per_second(5), 3), .tenant = fixed_window_policy(7, 1s)};
  compare_with_memory(*b, clock_, mixed, 300ms);
  rule counters{
      .name = "counters", .limit = fixed_window_policy(3, 500ms), .tenant = sliding_window_counter_policy(5, 1s)};
  compare_with_memory(*b, clock_, counters, 300ms);
}

TEST_F(RedisBackendTest, TokenBucketFigures) {
  auto b = make();
  rule r{.name = "api", .limit = token_bucket_policy(per_second(10), 5)};
  for (int i = 4; i >= 0; --i) {
    decision d = expect_decision(b->check({.rule = prepared(*b, r).get(), .key = "u"}));
    EXPECT_TRUE(d.allowed);
    EXPECT_EQ(d.remaining, i);
    EXPECT_EQ(d.reset_after, (5 - i) * 100ms);
  }
  decision refused = expect_decision(b->check({.rule = prepared(*b, r).get(), .key = "u"}));
  EXPECT_FALSE(refused.allowed);
  EXPECT_EQ(refused.remaining, 0);
  EXPECT_EQ(refused.retry_after, 100ms);
  EXPECT_EQ(refused.reset_after, 500ms);
  clock_.advance(100ms);
  EXPECT_TRUE(expect_decision(b->check({.rule = prepared(*b, r).get(), .key = "u"})).allowed);
  // A refusal takes nothing; one key is one string.
  EXPECT_EQ(redis_->string({"TYPE", detail::single_key("sluice:", "api", "u", "tb2")}), "string");
}

TEST_F(RedisBackendTest, SlidingWindowLogResetAtIsOldestPlusWindow) {
  auto b = make();
  rule r{.name = "ai", .limit = sliding_window_policy(3, 10s)};
  const auto start = clock_.now();
  for (int i = 0; i < 3; ++i) {
    decision d = expect_decision(b->check({.rule = prepared(*b, r).get(), .key = "k"}));
    EXPECT_TRUE(d.allowed);
    EXPECT_EQ(d.remaining, 2 - i);
    clock_.advance(1s);
  }
  decision refused = expect_decision(b->check({.rule = prepared(*b, r).get(), .key = "k"}));  // at start + 3 s
  EXPECT_FALSE(refused.allowed);
  EXPECT_EQ(refused.retry_after, 7s);  // oldest (start) + 10 s − now
  EXPECT_EQ(refused.reset_after, 9s);  // newest (start + 2 s) + 10 s − now
  clock_.set(start + 10s);             // the oldest leaves (now − W, now]
  EXPECT_TRUE(expect_decision(b->check({.rule = prepared(*b, r).get(), .key = "k"})).allowed);
  EXPECT_FALSE(expect_decision(b->check({.rule = prepared(*b, r).get(), .key = "k"})).allowed);
}

TEST_F(RedisBackendTest, SlidingWindowLogKeepsAdmissionsOfTheSameMicrosecond) {
  auto b = make();
  rule r{.name = "burst", .limit = sliding_window_policy(10, 1min)};
  for (int i = 0; i < 4; ++i)
    EXPECT_TRUE(expect_decision(b->check({.rule = prepared(*b, r).get(), .key = "k", .cost = 2})).allowed);
  const std::string key = detail::single_key("sluice:", "burst", "k", detail::state_tag(r.limit));
  EXPECT_EQ(redis_->log_units(key), 8);
  EXPECT_EQ(redis_->integer({"ZCARD", key}), 1);  // one instant: one entry
  decision d = expect_decision(b->check({.rule = prepared(*b, r).get(), .key = "k", .cost = 3}));
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.remaining, 2);
  EXPECT_EQ(redis_->log_units(key), 8);  // refused: not recorded
}

// One entry per admission, whatever its cost: a client choosing its cost cannot make one check
// hold Redis for O(cost) work, nor its memory grow with the cost.
TEST_F(RedisBackendTest, SlidingWindowLogWorkAndMemoryAreIndependentOfCost) {
  auto b = make();
  rule r{.name = "huge", .limit = sliding_window_policy(1'000'000, 1h)};
  const std::string key = detail::single_key("sluice:", "huge", "k", detail::state_tag(r.limit));
  redis_->command({"CONFIG", "RESETSTAT"});
  EXPECT_TRUE(expect_decision(b->check({.rule = prepared(*b, r).get(), .key = "k", .cost = 1'000'000})).allowed);
  EXPECT_EQ(redis_->integer({"ZCARD", key}), 1);
  for (int i = 0; i < 20; ++i) {
    clock_.advance(1ms);
    decision refused = expect_decision(b->check({.rule = prepared(*b, r).get(), .key = "k", .cost = 999'999}));
    ASSERT_FALSE(refused.allowed);
    EXPECT_EQ(refused.retry_after, 1h - (i + 1) * 1ms);
  }
  // The commands the scripts ran: one write for the admission, none per unit (the old log did a
  // ZADD per unit: a million here).
  auto reply = redis_->command({"INFO", "commandstats"});
  std::string text(reply->str, reply->len);
  auto at = text.find("cmdstat_zadd:calls=");
  ASSERT_NE(at, std::string::npos) << text;
  EXPECT_EQ(std::stoll(text.substr(at + 19)), 1);
  clock_.advance(1h);
  EXPECT_TRUE(expect_decision(b->check({.rule = prepared(*b, r).get(), .key = "k", .cost = 1'000'000})).allowed);
  EXPECT_EQ(redis_->integer({"ZCARD", key}), 1);
}

TEST_F(RedisBackendTest, FixedWindowCountsPerAlignedWindow) {
  auto b = make();
  rule r{.name = "quota", .limit = fixed_window_policy(2, 1min)};
  // Move to the start of an aligned minute.
  const auto minute = std::chrono::duration_cast<std::chrono::minutes>(clock_.now().time_since_epoch()) + 1min;
  clock_.set(time_point(minute) + 10s);
  EXPECT_TRUE(expect_decision(b->check({.rule = prepared(*b, r).get(), .key = "k"})).allowed);
  EXPECT_TRUE(expect_decision(b->check({.rule = prepared(*b, r).get(), .key = "k"})).allowed);
  decision d = expect_decision(b->check({.rule = prepared(*b, r).get(), .key = "k"}));
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after, 50s);
  clock_.advance(50s);
  EXPECT_TRUE(expect_decision(b->check({.rule = prepared(*b, r).get(), .key = "k"})).allowed);
}

TEST_F(RedisBackendTest, EveryKeyHasATimeToLive) {
  auto b = make();
  rule tb{.name = "tb", .limit = token_bucket_policy(per_second(2), 10)};
  rule swl{.name = "swl", .limit = sliding_window_policy(10, 30s)};
  rule swc{.name = "swc", .limit = sliding_window_counter_policy(10, 30s)};
  rule fw{.name = "fw", .limit = fixed_window_policy(10, 30s)};
  rule dual{.name = "dual", .limit = sliding_window_policy(5, 30s), .tenant = token_bucket_policy(per_second(1), 20)};
  for (const rule* r : {&tb, &swl, &swc, &fw, &dual}) {
    for (int i = 0; i < 3; ++i) {
      EXPECT_TRUE(
          expect_decision(b->check({.rule = prepared(*b, *r).get(), .key = "k", .tenant = "t", .user = "u"})).allowed)
          << r->name;
    }
  }
  auto keys = redis_->keys();
  EXPECT_EQ(keys.size(), 6u);
  for (const auto& k : keys) {
    long long ttl = redis_->integer({"PTTL", k});
    EXPECT_GT(ttl, 0) << k;
    // No longer than the state needs: 60 s (two counter windows) at most here.
    EXPECT_LE(ttl, 60'000) << k;
  }
  // The bucket's key lives until it is full again, 3 tokens at 2/s, and at most as long again (a
  // write sets the TTL to twice the debt, and writes within it keep it). Real time runs on meanwhile.
  const long long bucket_ttl = redis_->integer({"PTTL", detail::single_key("sluice:", "tb", "k", "tb2")});
  EXPECT_GE(bucket_ttl, 1500 - 200);
  EXPECT_LE(bucket_ttl, 3000);
}

// A key's value is read as the scripts write it (doubles, struct.pack) or not at all: anything else
// there — text, the wrong length, NaNs, infinities — counts as an empty key, and the check is
// answered, never an error.
TEST_F(RedisBackendTest, UnreadableStateCountsAsEmpty) {
  auto b = make();
  const rule rules[] = {
      {.name = "tb", .limit = token_bucket_policy(per_second(2), 10)},
      {.name = "swc", .limit = sliding_window_counter_policy(10, 30s)},
      {.name = "fw", .limit = fixed_window_policy(10, 30s)},
  };
  const std::string values[] = {"12 3",
                                "1796000000000000.123 500000000 5000000000",
                                std::string(16, '\xff'),
                                std::string(24, '\xff'),
                                std::string(40, '\xff'),
                                std::string(40, '\0'),
                                std::string(39, '\x7f')};
  for (const rule& r : rules) {
    for (const std::string& v : values) {
      const std::string key = detail::single_key("sluice:", r.name, "k", detail::state_tag(r.limit));
      redis_->command({"SET", key, v});
      decision d = expect_decision(b->check({.rule = prepared(*b, r).get(), .key = "k"}));
      EXPECT_TRUE(d.allowed) << r.name;
      EXPECT_EQ(d.remaining, 9) << r.name << " after a value of " << v.size() << " bytes";
      redis_->command({"DEL", key});
    }
  }
}

TEST_F(RedisBackendTest, DualLayerRefusalConsumesNothingOfTheOtherLayer) {
  auto b = make();
  rule r{.name = "api", .limit = sliding_window_policy(2, 1min), .tenant = sliding_window_policy(3, 1min)};
  const std::string tenant_key = detail::tenant_key("sluice:", "api", "acme", detail::state_tag(*r.tenant));
  const std::string alice_key = detail::user_key("sluice:", "api", "acme", "alice", detail::state_tag(r.limit));
  const std::string bob_key = detail::user_key("sluice:", "api", "acme", "bob", detail::state_tag(r.limit));
  auto check = [&](std::string_view user) {
    return expect_decision(b->check({.rule = prepared(*b, r).get(), .tenant = "acme", .user = user}));
  };
  EXPECT_TRUE(check("alice").allowed);
  EXPECT_TRUE(check("alice").allowed);
  decision user_refused = check("alice");
  EXPECT_FALSE(user_refused.allowed);
  EXPECT_EQ(user_refused.rejected_by, layer::user);
  EXPECT_EQ(user_refused.tenant.remaining, 1);  // the tenant's last unit is untouched
  EXPECT_EQ(redis_->log_units(tenant_key), 2);

  decision bob = check("bob");
  EXPECT_TRUE(bob.allowed);
  EXPECT_EQ(bob.tenant.remaining, 0);
  EXPECT_EQ(bob.user.remaining, 1);
  EXPECT_EQ(bob.remaining, 0);
  decision tenant_refused = check("bob");
  EXPECT_FALSE(tenant_refused.allowed);
  EXPECT_EQ(tenant_refused.rejected_by, layer::tenant);
  EXPECT_EQ(tenant_refused.user.remaining, 1);  // bob's quota is untouched
  EXPECT_EQ(redis_->log_units(bob_key), 1);
  EXPECT_EQ(redis_->log_units(alice_key), 2);
  // Both keys of a tenant share one hash tag, hence one Cluster slot.
  EXPECT_EQ(hash_tag(tenant_key), hash_tag(bob_key));
  EXPECT_EQ(hash_tag(tenant_key), "acme");
}

TEST_F(RedisBackendTest, HostileIdsNeitherCollideNorBreakTheHashTag) {
  auto b = make();
  rule single{.name = "r", .limit = fixed_window_policy(1, 1min)};
  rule dual{.name = "d", .limit = fixed_window_policy(1, 1min), .tenant = fixed_window_policy(100, 1min)};
  const std::string binary("\x00\x01\xff{}\r\n", 7);
  const std::vector<std::string> ids = {"a",
                                        "a}:user:b",
                                        "a:user:b",
                                        "a}",
                                        "{a}",
                                        "a{b}",
                                        "a%7Db",
                                        "a%",
                                        "a:b",
                                        "a%3Ab",
                                        "}",
                                        "{",
                                        ":",
                                        "%",
                                        " ",
                                        binary,
                                        "user",
                                        "b",
                                        std::string(max_key_length, 'x'),
                                        "\xe2\x82\xac"};
  // Each distinct id has its own limit of 1: a collision would refuse the second one.
  for (const auto& id : ids) {
    EXPECT_TRUE(expect_decision(b->check({.rule = prepared(*b, single).get(), .key = id})).allowed) << id;
  }
  for (const auto& tenant : ids) {
    for (const auto& user : {std::string("b"), std::string("user:b"), std::string("}{")}) {
      decision d = expect_decision(b->check({.rule = prepared(*b, dual).get(), .tenant = tenant, .user = user}));
      EXPECT_TRUE(d.allowed) << tenant << " / " << user;
    }
  }
  auto keys = redis_->keys();
  EXPECT_EQ(keys.size(), ids.size() + ids.size() + ids.size() * 3);
  std::set<std::string> tags;
  for (const auto& k : keys) {
    // Exactly one hash tag per key, and it is the encoded id (or rule:id).
    ASSERT_EQ(std::count(k.begin(), k.end(), '{'), 1) << k;
    ASSERT_EQ(std::count(k.begin(), k.end(), '}'), 1) << k;
    EXPECT_LT(k.find('{'), k.find('}'));
    for (char c : k) EXPECT_TRUE(c > 0x20 && c < 0x7f) << k;
  }
  // A tenant's user keys share the tenant key's slot, whatever the ids.
  const std::string hostile = "a}:user:b";
  const std::string t = detail::tenant_key("sluice:", "d", hostile, "fw.1000000");
  EXPECT_EQ(hash_tag(t), hash_tag(detail::user_key("sluice:", "d", hostile, "}{", "fw.1000000")));
  EXPECT_EQ(hash_tag(t), "a%7D%3Auser%3Ab");
  EXPECT_EQ(hash_tag(detail::single_key("sluice:", "r", hostile, "fw.1000000")), "r:a%7D%3Auser%3Ab");
}

// Every id of up to 3 bytes over an alphabet of the troublesome bytes: no two requests share a key,
// whichever layout (single, tenant, user) they use.
TEST(RedisKeyEncodingTest, DistinctRequestsNeverShareAKey) {
  const std::string alphabet("{}:%\x00\xff rkt", 10);
  std::vector<std::string> ids = {""};
  for (std::size_t len = 1; len <= 3; ++len) {
    std::vector<std::string> next;
    for (const auto& id : ids) {
      if (id.size() + 1 != len) continue;
      for (char c : alphabet) next.push_back(id + c);
    }
    ids.insert(ids.end(), next.begin(), next.end());
  }
  ids.erase(ids.begin());  // empty ids are refused before any key is made
  // key -> the request (layout, rule, id, id) that made it
  using request = std::tuple<int, std::string, std::string, std::string>;
  std::map<std::string, request> seen;
  auto add = [&](const std::string& key, const request& r) {
    auto [it, inserted] = seen.emplace(key, r);
    EXPECT_TRUE(inserted || it->second == r) << "two requests share " << key;
  };
  for (const auto& a : ids) {
    add(detail::single_key("p:", "r", a, "fw.1000000"), {0, "r", a, ""});
    add(detail::single_key("p:", a, "k", "fw.1000000"), {0, a, "k", ""});
    add(detail::tenant_key("p:", "r", a, "fw.1000000"), {1, "r", a, ""});
    add(detail::tenant_key("p:", a, "t", "fw.1000000"), {1, a, "t", ""});
    add(detail::user_key("p:", "r", a, "u", "fw.1000000"), {2, "r", a, "u"});
    add(detail::user_key("p:", "r", "t", a, "fw.1000000"), {2, "r", "t", a});
    add(detail::user_key("p:", a, "t", "u", "fw.1000000"), {2, a, "t", "u"});
  }
  std::set<request> distinct;
  for (const auto& [key, r] : seen) distinct.insert(r);
  EXPECT_EQ(seen.size(), distinct.size());
  EXPECT_GT(seen.size(), ids.size() * 6);
  // The algorithm and the window are part of the key: a rule changing either never reads the old
  // state; a rule changing its limit alone does.
  const policy fw = fixed_window_policy(5, 1s);
  EXPECT_NE(detail::single_key("p:", "r", "k", detail::state_tag(fw)),
            detail::single_key("p:", "r", "k", detail::state_tag(sliding_window_counter_policy(5, 1s))));
  EXPECT_NE(detail::state_tag(fw), detail::state_tag(fixed_window_policy(5, 2s)));
  EXPECT_EQ(detail::state_tag(fw), detail::state_tag(fixed_window_policy(50, 1s)));
  EXPECT_EQ(detail::state_tag(token_bucket_policy(per_second(1), 5)), "tb2");
}

// A rule's limits changed at run time (a reload, etcd): its keys keep what they used. A window's
// count stays under the new limit; a token bucket keeps its tokens (x/time/rate's SetLimit/SetBurst,
// as in process); a new window starts afresh.
TEST_F(RedisBackendTest, ChangedLimitsKeepTheKeysState) {
  auto b = make();
  rule bucket{.name = "tb2", .limit = token_bucket_policy(per_second(1), 10)};
  EXPECT_TRUE(
      expect_decision(b->check({.rule = prepared(*b, bucket).get(), .key = "k", .cost = 6})).allowed);  // 4 left
  rule faster{.name = "tb2", .limit = token_bucket_policy(per_second(2), 10)};
  decision d = expect_decision(b->check({.rule = prepared(*b, faster).get(), .key = "k", .cost = 4}));
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 0);
  EXPECT_FALSE(expect_decision(b->check({.rule = prepared(*b, faster).get(), .key = "k"})).allowed);
  clock_.advance(500ms);
  EXPECT_TRUE(expect_decision(b->check({.rule = prepared(*b, faster).get(), .key = "k"})).allowed)
      << "refilled at the new rate";
  rule lower{.name = "tb2", .limit = token_bucket_policy(per_second(0.5), 10)};
  clock_.advance(1s);  // 2 tokens at 2/s; from here 0.5/s
  EXPECT_EQ(expect_decision(b->check({.rule = prepared(*b, lower).get(), .key = "k", .cost = 2})).remaining, 0);
  clock_.advance(1s);
  EXPECT_FALSE(expect_decision(b->check({.rule = prepared(*b, lower).get(), .key = "k"})).allowed)
      << "half a token: nothing forgiven";
  clock_.advance(1s);
  EXPECT_TRUE(expect_decision(b->check({.rule = prepared(*b, lower).get(), .key = "k"})).allowed);

  rule window{.name = "w", .limit = fixed_window_policy(5, 1h)};
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE(expect_decision(b->check({.rule = prepared(*b, window).get(), .key = "k"})).allowed);
  rule raised{.name = "w", .limit = fixed_window_policy(10, 1h)};
  EXPECT_EQ(expect_decision(b->check({.rule = prepared(*b, raised).get(), .key = "k"})).remaining, 6);
  rule lowered{.name = "w", .limit = fixed_window_policy(2, 1h)};
  EXPECT_FALSE(expect_decision(b->check({.rule = prepared(*b, lowered).get(), .key = "k"})).allowed);
  rule longer{.name = "w", .limit = fixed_window_policy(2, 2h)};
  EXPECT_EQ(expect_decision(b->check({.rule = prepared(*b, longer).get(), .key = "k"})).remaining, 1)
      << "a new window starts afresh";
}

// A smaller burst can leave a bucket full: its key goes, and the check that found it so writes a
// new one, with a TTL of its own (not one kept from the key that went).
TEST_F(RedisBackendTest, ABucketEmptiedByANewBurstStillExpires) {
  auto b = make();
  rule bucket{.name = "shrunk", .limit = token_bucket_policy(per_second(1), 10)};
  EXPECT_TRUE(expect_decision(b->check({.rule = prepared(*b, bucket).get(), .key = "k"})).allowed);
  clock_.advance(500ms);
  rule smaller{.name = "shrunk", .limit = token_bucket_policy(per_second(1), 5)};
  decision d = expect_decision(b->check({.rule = prepared(*b, smaller).get(), .key = "k"}));
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.remaining, 4);
  const long long ttl = redis_->integer({"PTTL", detail::single_key("sluice:", "shrunk", "k", "tb2")});
  EXPECT_GT(ttl, 0);
  EXPECT_LE(ttl, 2000);
}

TEST_F(RedisBackendTest, RejectedRequestsSendNothing) {
  auto b = make();
  rule r{.name = "r", .limit = fixed_window_policy(5, 1min)};
  rule dual{.name = "d", .limit = fixed_window_policy(1, 1min), .tenant = fixed_window_policy(1, 1min)};
  const std::string huge(10 * 1024, 'k');
  auto too_long = b->check({.rule = prepared(*b, r).get(), .key = huge});
  ASSERT_FALSE(too_long.ok());
  EXPECT_EQ(too_long.error(), errc::key_too_long);
  auto empty = b->check({.rule = prepared(*b, r).get(), .key = ""});
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.error(), errc::invalid_argument);
  EXPECT_FALSE(b->check({.rule = prepared(*b, dual).get(), .tenant = huge, .user = "u"}).ok());
  EXPECT_FALSE(b->check({.rule = prepared(*b, dual).get(), .tenant = "t", .user = huge}).ok());
  EXPECT_FALSE(b->check({.rule = prepared(*b, dual).get(), .tenant = "", .user = "u"}).ok());
  EXPECT_FALSE(b->check({.rule = prepared(*b, r).get(), .key = "k", .cost = 6}).ok());
  EXPECT_FALSE(b->check({.rule = prepared(*b, r).get(), .key = "k", .cost = -1}).ok());
  EXPECT_FALSE(b->check({.rule = nullptr, .key = "k"}).ok());
  EXPECT_EQ(redis_->integer({"DBSIZE"}), 0);
  EXPECT_EQ(b->stats().checks, 0u);
}

TEST_F(RedisBackendTest, ScriptsComeBackAfterScriptFlush) {
  auto b = make();
  rule r{.name = "r", .limit = sliding_window_policy(100, 1min)};
  rule dual{.name = "d", .limit = token_bucket_policy(per_second(1), 10), .tenant = fixed_window_policy(100, 1min)};
  EXPECT_TRUE(expect_decision(b->check({.rule = prepared(*b, r).get(), .key = "k"})).allowed);
  redis_->command({"SCRIPT", "FLUSH"});
  decision d = expect_decision(b->check({.rule = prepared(*b, r).get(), .key = "k"}));
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.source, decision_source::limiter);
  EXPECT_EQ(d.remaining, 98);
  EXPECT_EQ(expect_decision(b->check({.rule = prepared(*b, dual).get(), .tenant = "t", .user = "u"})).source,
            decision_source::limiter);
  EXPECT_GE(b->stats().script_reloads, 1u);
  // Reloaded once: later checks use EVALSHA again.
  auto reloads = b->stats().script_reloads;
  EXPECT_TRUE(expect_decision(b->check({.rule = prepared(*b, r).get(), .key = "k"})).allowed);
  EXPECT_EQ(b->stats().script_reloads, reloads);
}

TEST_F(RedisBackendTest, SelectsTheConfiguredDatabase) {
  auto b = make({.database = 3});
  rule r{.name = "r", .limit = fixed_window_policy(5, 1min)};
  EXPECT_EQ(expect_decision(b->check({.rule = prepared(*b, r).get(), .key = "k"})).source, decision_source::limiter);
  EXPECT_EQ(redis_->integer({"DBSIZE"}), 0);
  redis_->command({"SELECT", "3"});
  EXPECT_EQ(redis_->integer({"DBSIZE"}), 1);
  redis_->command({"SELECT", "0"});
}

TEST_F(RedisBackendTest, BlockingCheckOnTheIoThreadIsAnErrorNotADeadlock) {
  auto b = make();
  rule r{.name = "r", .limit = fixed_window_policy(5, 1min)};
  auto p = prepared(*b, r);
  std::promise<result<decision>> inner;
  b->async_check({.rule = p.get(), .key = "k"},
                 [&](result<decision>) { inner.set_value(b->check({.rule = p.get(), .key = "k"})); });
  auto got = inner.get_future().get();
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.error(), errc::invalid_argument);
}

TEST_F(RedisBackendTest, InvalidOptionsAreErrors) {
  EXPECT_FALSE(make_redis_backend({.addresses = {}}).ok());
  EXPECT_FALSE(make_redis_backend({.addresses = {"localhost"}}).ok());
  EXPECT_FALSE(make_redis_backend({.addresses = {"localhost:0"}}).ok());
  EXPECT_FALSE(make_redis_backend({.addresses = {"localhost:99999"}}).ok());
  EXPECT_FALSE(make_redis_backend({.key_prefix = "app{x}:"}).ok());
  EXPECT_FALSE(make_redis_backend({.command_timeout = 0ms}).ok());
  EXPECT_FALSE(make_redis_backend({.max_pending = 0}).ok());
  // Durations are added to steady_clock::now() in ns: huge ones would overflow.
  EXPECT_FALSE(make_redis_backend({.command_timeout = std::chrono::milliseconds::max()}).ok());
  EXPECT_FALSE(make_redis_backend({.connect_timeout = std::chrono::milliseconds::max()}).ok());
  EXPECT_FALSE(make_redis_backend({.breaker_probe_interval = std::chrono::milliseconds::max()}).ok());
  EXPECT_FALSE(make_redis_backend({.error_log_interval = std::chrono::milliseconds::max()}).ok());
}

TEST_F(RedisBackendTest, CompletionTokens) {
  auto b = make();
  auto memory = make_memory_backend({.clock = &clock_}).value();
  rule r{.name = "r", .limit = fixed_window_policy(100, 1min)};
  for (backend* be : {static_cast<backend*>(b.get()), static_cast<backend*>(memory.get())}) {
    auto p = prepared(*be, r);
    const check_request req{.rule = p.get(), .key = "k"};
    // use_future
    std::future<result<decision>> f = async_check(*be, req, asio::use_future);
    EXPECT_TRUE(expect_decision(f.get()).allowed);
    // callback and use_awaitable on an io_context the test runs
    asio::io_context io;
    std::atomic<int> callbacks{0};
    async_check(*be, req, [&](result<decision> d) {
      EXPECT_TRUE(expect_decision(std::move(d)).allowed);
      ++callbacks;
    });
    std::int64_t remaining = -1;
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          result<decision> d = co_await async_check(*be, req, asio::use_awaitable);
          remaining = expect_decision(std::move(d)).remaining;
        },
        asio::detached);
    io.run();  // returns once the awaited check completed (its work guard kept io running)
    EXPECT_GE(remaining, 0);
    // The plain callback ran on its own executor (system), so wait for it boundedly.
    for (int i = 0; i < 200 && callbacks == 0; ++i) std::this_thread::sleep_for(10ms);
    EXPECT_EQ(callbacks.load(), 1);
  }
}

TEST_F(RedisBackendTest, AsyncChecksArePipelinedAndAllComplete) {
  auto b = make();
  rule r{.name = "r", .limit = sliding_window_policy(500, 1min)};
  std::atomic<int> allowed{0};
  std::atomic<int> done{0};
  std::promise<void> all;
  constexpr int n = 2000;
  auto p = prepared(*b, r);
  for (int i = 0; i < n; ++i) {
    b->async_check({.rule = p.get(), .key = "k"}, [&](result<decision> d) {
      if (d.ok() && d->allowed && d->source == decision_source::limiter) allowed.fetch_add(1);
      if (done.fetch_add(1) + 1 == n) all.set_value();
    });
  }
  all.get_future().wait();
  EXPECT_EQ(allowed.load(), 500);
  EXPECT_EQ(b->stats().pending, 0u);
  EXPECT_EQ(b->stats().redis_decisions, static_cast<std::uint64_t>(n));
}

// One single-layer rule of each algorithm, with limits small enough for bursts to reach them.
std::vector<rule> batch_rules() {
  return {
      {.name = "tb", .limit = token_bucket_policy(per_second(20), 6)},
      {.name = "swl", .limit = sliding_window_policy(8, 1s)},
      {.name = "swc", .limit = sliding_window_counter_policy(8, 1s)},
      {.name = "fw", .limit = fixed_window_policy(8, 1s)},
  };
}

// A backend on the test's own io_context, run only while the test waits for answers: a burst's
// checks are all queued before the first is sent, so the others find a call in flight and share
// batch calls — as under load, but every time, however loaded the machine.
struct held_io_backend {
  asio::io_context io;
  std::unique_ptr<redis_backend> backend;

  held_io_backend(const std::string& address, sluice::clock* clock) {
    backend = make_redis_backend({.addresses = {address}, .command_timeout = 2s, .clock_for_test = clock}, io).value();
    run_until([&] { return backend->ready(); });
  }
  ~held_io_backend() {
    io.stop();  // then the backend closes its connection on this thread
    backend.reset();
  }
  redis_backend* operator->() const { return backend.get(); }
  void run_until(const std::function<bool()>& done) {
    while (!done()) io.run_one_for(std::chrono::milliseconds(10));
  }
};

// Bursts of asynchronous checks from one thread over a few keys of every kind of rule: those that
// arrive while calls are in flight share calls of the batch script, and each decision is the one
// the in-process backend gives the same checks one by one in the same order (a batch is one µs).
TEST_F(RedisBackendTest, BatchedChecksDecideAsOneByOneInOrder) {
  held_io_backend b(redis_->address(), &clock_);
  auto memory = make_memory_backend({.clock = &clock_}).value();
  std::vector<rule> rules = batch_rules();
  rules.push_back(
      {.name = "dual", .limit = fixed_window_policy(4, 1s), .tenant = token_bucket_policy(per_second(20), 7)});
  const testing::twin_rules twins(*b.backend, *memory, rules);
  const std::string ids[] = {"a", "b", "c"};
  std::mt19937 rng(5);
  const std::uint64_t calls_before = b->stats().calls;
  int checks = 0;
  for (int burst = 0; burst < 40; ++burst) {
    clock_.advance(std::chrono::milliseconds(rng() % 150));
    std::vector<check_request> reqs;
    for (int i = 0; i < 24; ++i) {
      const prepared_rule* r = twins.on_a[rng() % std::size(rules)].get();
      const std::string& id = ids[rng() % 3];
      // A cost of 0 looks: in a batch, beside checks, as alone.
      reqs.push_back({.rule = r, .key = id, .tenant = ids[rng() % 2], .user = id, .cost = static_cast<std::int64_t>(rng() % 3)});
    }
    std::vector<std::optional<result<decision>>> answers(reqs.size());
    std::size_t answered = 0;
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      b->async_check(reqs[i], [&answers, &answered, i](result<decision> d) {
        answers[i] = std::move(d);
        ++answered;
      });
    }
    b.run_until([&] { return answered == reqs.size(); });
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      expect_same(expect_decision(*answers[i]), expect_decision(memory->check(twins.on_b_of(reqs[i]))),
                  "burst " + std::to_string(burst) + " check " + std::to_string(i));
      ++checks;
    }
    if (HasFailure()) return;
  }
  EXPECT_LT(b->stats().calls - calls_before, static_cast<std::uint64_t>(checks) / 2) << "checks shared calls";
}

// check_all groups share batch calls with single checks, each group still all or nothing: the
// decisions are those of the same calls one by one in process.
TEST_F(RedisBackendTest, BatchedCheckAllGroupsDecideAsOneByOneInOrder) {
  held_io_backend b(redis_->address(), &clock_);
  auto memory = make_memory_backend({.clock = &clock_}).value();
  const std::vector<rule> rules = batch_rules();
  const testing::twin_rules twins(*b.backend, *memory, rules);
  const std::string ids[] = {"a", "b", "c"};
  std::mt19937 rng(9);
  const std::uint64_t calls_before = b->stats().calls;
  int calls = 0;
  for (int burst = 0; burst < 30; ++burst) {
    clock_.advance(std::chrono::milliseconds(rng() % 150));
    // Each call: a group of one check per rule picked (distinct rules), or a single check.
    std::vector<std::vector<check_request>> groups(16);
    for (auto& g : groups) {
      const std::size_t n = 1 + rng() % 3;
      const std::size_t first = rng() % std::size(rules);
      for (std::size_t i = 0; i < n; ++i) {
        g.push_back(
            {.rule = twins.on_a[(first + i) % std::size(rules)].get(), .key = ids[rng() % 3], .cost = static_cast<std::int64_t>(1 + rng() % 3)});
      }
    }
    std::vector<std::optional<result<std::vector<decision>>>> answers(groups.size());
    std::size_t answered = 0;
    for (std::size_t i = 0; i < groups.size(); ++i) {
      if (groups[i].size() == 1 && i % 2 == 0) {
        b->async_check(groups[i][0], [&answers, &answered, i](result<decision> d) {
          answers[i] =
              d ? result<std::vector<decision>>(std::vector<decision>{*d}) : result<std::vector<decision>>(d.error());
          ++answered;
        });
      } else {
        b->async_check_all(groups[i], [&answers, &answered, i](result<std::vector<decision>> d) {
          answers[i] = std::move(d);
          ++answered;
        });
      }
    }
    b.run_until([&] { return answered == groups.size(); });
    for (std::size_t i = 0; i < groups.size(); ++i) {
      auto got = *answers[i];
      ASSERT_TRUE(got.ok()) << got.error().message;
      std::vector<check_request> on_memory;
      for (const check_request& c : groups[i]) on_memory.push_back(twins.on_b_of(c));
      auto want = memory->check_all(on_memory).value();
      for (std::size_t k = 0; k < want.size(); ++k) {
        expect_same((*got)[k], want[k], "burst " + std::to_string(burst) + " call " + std::to_string(i));
      }
      ++calls;
    }
    if (HasFailure()) return;
  }
  EXPECT_LT(b->stats().calls - calls_before, static_cast<std::uint64_t>(calls) / 2) << "groups shared calls";
}

TEST_F(RedisBackendTest, MaxBatchOneSendsEveryCheckAlone) {
  redis_options o;
  o.max_batch = 1;
  auto b = make(o);
  rule r{.name = "r", .limit = fixed_window_policy(50, 1min)};
  auto p = prepared(*b, r);
  std::vector<std::promise<result<decision>>> answers(100);
  for (auto& a : answers)
    b->async_check({.rule = p.get(), .key = "k"}, [&a](result<decision> d) { a.set_value(std::move(d)); });
  int allowed = 0;
  for (auto& a : answers) allowed += expect_decision(a.get_future().get()).allowed;
  EXPECT_EQ(allowed, 50);
  EXPECT_EQ(b->stats().calls, 100u);
  o.max_batch = 0;
  o.addresses = {redis_->address()};
  EXPECT_EQ(make_redis_backend(o).error().code, errc::invalid_argument);
}

TEST_F(RedisBackendTest, RunsOnTheCallersIoContext) {
  asio::io_context io;
  auto work = asio::make_work_guard(io);
  std::thread runner([&] { io.run(); });
  rule r{.name = "r", .limit = fixed_window_policy(2, 1min)};
  {
    auto b =
        make_redis_backend({.addresses = {redis_->address()}, .command_timeout = 2s, .clock_for_test = &clock_}, io);
    ASSERT_TRUE(b.ok());
    EXPECT_TRUE(expect_decision((*b)->check({.rule = prepared(**b, r).get(), .key = "k"})).allowed);
    auto p = prepared(**b, r);
    std::future<result<decision>> f = async_check(**b, {.rule = p.get(), .key = "k"}, asio::use_future);
    EXPECT_EQ(expect_decision(f.get()).remaining, 0);
  }  // destroyed while the io_context runs
  work.reset();
  runner.join();
}

TEST_F(RedisBackendTest, ResolvesHostNames) {
  auto b = make_redis_backend({.addresses = {"localhost:" + std::to_string(redis_->port())}, .command_timeout = 2s});
  ASSERT_TRUE(b.ok());
  rule r{.name = "r", .limit = fixed_window_policy(2, 1min)};
  // Checks issued while the name resolves wait for the connection instead of failing.
  decision d = expect_decision((*b)->check({.rule = prepared(**b, r).get(), .key = "k"}));
  EXPECT_EQ(d.source, decision_source::limiter);
}

TEST_F(RedisBackendTest, InvalidRulesAreErrorsAndSendNothing) {
  auto b = make();
  rule zero_window{.name = "z", .limit = {.algorithm = algorithm::fixed_window, .limit = 5}};
  rule nan_rate{.name = "n", .limit = token_bucket_policy(per_second(std::nan("")), 5)};
  EXPECT_EQ(b->prepare(zero_window).error(), errc::invalid_argument);
  EXPECT_EQ(b->prepare(nan_rate).error(), errc::invalid_argument);
  EXPECT_EQ(redis_->integer({"DBSIZE"}), 0);
}

TEST_F(RedisBackendTest, DegenerateBuckets) {
  auto b = make();
  rule empty{.name = "empty", .limit = token_bucket_policy(per_second(10), 0)};
  decision d = expect_decision(b->check({.rule = prepared(*b, empty).get(), .key = "k"}));
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_after, never);
  rule unlimited{.name = "inf", .limit = token_bucket_policy(rate::infinite(), 3)};
  for (int i = 0; i < 10; ++i)
    EXPECT_TRUE(expect_decision(b->check({.rule = prepared(*b, unlimited).get(), .key = "k", .cost = 3})).allowed);
  rule no_refill{.name = "zero", .limit = token_bucket_policy(per_second(0), 2)};
  EXPECT_TRUE(expect_decision(b->check({.rule = prepared(*b, no_refill).get(), .key = "k"})).allowed);
  EXPECT_TRUE(expect_decision(b->check({.rule = prepared(*b, no_refill).get(), .key = "k"})).allowed);
  decision spent = expect_decision(b->check({.rule = prepared(*b, no_refill).get(), .key = "k"}));
  EXPECT_FALSE(spent.allowed);
  EXPECT_GT(spent.retry_after, std::chrono::hours(24 * 365 * 50));  // "practically never", as in process
  // Same as in process.
  auto memory = make_memory_backend({.clock = &clock_}).value();
  auto in_process = prepared(*memory, no_refill);
  memory->check({.rule = in_process.get(), .key = "k"}).value();
  memory->check({.rule = in_process.get(), .key = "k"}).value();
  decision local = memory->check({.rule = in_process.get(), .key = "k"}).value();
  EXPECT_LE(std::chrono::abs(local.retry_after - spent.retry_after), 1us);
  for (const auto& k : redis_->keys()) EXPECT_GT(redis_->integer({"PTTL", k}), 0) << k;
}

// A token bucket at a high rate: the script's TAT must advance by exactly cost × interval. With the
// TAT as a double in µs since the epoch (steps of 0.25 µs today), an interval of 1.1 µs advanced it
// by 1 µs per token and let 10% more through than in process.
TEST_F(RedisBackendTest, TokenBucketAtHighRatesAdmitsExactlyTheBurst) {
  auto b = make();
  auto memory = make_memory_backend({.clock = &clock_}).value();
  // Interval 1100 ns. Key TTLs run in real time while the test clock stands still: a deep debt (11 s)
  // keeps the key alive throughout.
  rule r{.name = "fast", .limit = token_bucket_policy(per_second(1e9 / 1100), 10'000'000)};
  auto in_process = prepared(*memory, r);
  decision first = expect_decision(b->check({.rule = prepared(*b, r).get(), .key = "k", .cost = 9'999'900}));
  expect_same(first, memory->check({.rule = in_process.get(), .key = "k", .cost = 9'999'900}).value(),
              "cost 9,999,900");
  EXPECT_TRUE(first.allowed);
  int admitted = 0;
  for (int i = 0; i < 200; ++i) {
    decision d = expect_decision(b->check({.rule = prepared(*b, r).get(), .key = "k"}));
    expect_same(d, memory->check({.rule = in_process.get(), .key = "k"}).value(), "cost 1, check " + std::to_string(i));
    if (!d.allowed) break;
    ++admitted;
  }
  EXPECT_EQ(admitted, 100);
  // A refusal takes nothing: 2 µs later (Redis TIME counts whole µs) exactly one more token.
  clock_.advance(2us);
  EXPECT_TRUE(expect_decision(b->check({.rule = prepared(*b, r).get(), .key = "k"})).allowed);
  EXPECT_FALSE(expect_decision(b->check({.rule = prepared(*b, r).get(), .key = "k"})).allowed);
}

// Each key is first drained to a few tokens: its debt (10 s and more) then keeps it alive in real
// time, which TTLs follow, while the test clock moves by microseconds.
TEST_F(RedisBackendTest, TokenBucketAtHighRatesMatchesInProcess) {
  auto b = make();
  rule fastest{.name = "fastest", .limit = token_bucket_policy(per_second(1e6), 10'000'000)};  // interval 1 µs
  compare_with_memory(*b, clock_, fastest, 3us, 9'999'990);
  rule odd{.name = "odd", .limit = token_bucket_policy(per_second(1e9 / 1100), 10'000'000)};  // interval 1.1 µs
  compare_with_memory(*b, clock_, odd, 3us, 9'999'990);
  // Two users of a tenant take 9,999,990 each: both layers end a few tokens from refusing.
  rule dual{.name = "dual",
            .limit = token_bucket_policy(per_second(1e9 / 1700), 10'000'000),
            .tenant = token_bucket_policy(per_second(1e9 / 1300), 20'000'020)};
  compare_with_memory(*b, clock_, dual, 3us, 9'999'990);
}

// Above 10^6 per second the interval is under the 1 µs of Redis TIME: refused when prepared.
TEST_F(RedisBackendTest, TokenBucketRatesAboveOnePerMicrosecondAreRefused) {
  auto b = make();
  rule too_fast{.name = "too_fast", .limit = token_bucket_policy(per_second(1e8), 10)};
  auto d = b->prepare(too_fast);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error(), errc::invalid_argument);
  EXPECT_NE(d.error().message.find("rate 100000000 per second"), std::string::npos) << d.error().message;
  EXPECT_NE(d.error().message.find("too_fast"), std::string::npos) << d.error().message;
  rule tenant_too_fast{
      .name = "t", .limit = fixed_window_policy(5, 1s), .tenant = token_bucket_policy(per_second(1.5e6), 10)};
  auto t = b->prepare(tenant_too_fast);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.error(), errc::invalid_argument);
  EXPECT_NE(t.error().message.find("tenant layer"), std::string::npos) << t.error().message;
  EXPECT_EQ(redis_->integer({"DBSIZE"}), 0);
  EXPECT_EQ(b->stats().checks, 0u);
  EXPECT_EQ(b->stats().protocol_errors, 0u);
  // The boundary and an infinite rate are fine.
  rule fastest{.name = "fastest", .limit = token_bucket_policy(per_second(1e6), 10)};
  EXPECT_TRUE(expect_decision(b->check({.rule = prepared(*b, fastest).get(), .key = "k"})).allowed);
  rule unlimited{.name = "inf", .limit = token_bucket_policy(rate::infinite(), 10)};
  EXPECT_TRUE(expect_decision(b->check({.rule = prepared(*b, unlimited).get(), .key = "k"})).allowed);
}

// Windows up to nanoseconds::max() and limits near 2^63: no overflow in the arguments (UBSan), the
// scripts still decide, every key still expires; what Lua numbers cannot count exactly is refused.
TEST_F(RedisBackendTest, HugeWindowsAndLimitsNeitherOverflowNorReachTheScripts) {
  auto b = make();
  for (algorithm a : {algorithm::sliding_window_log, algorithm::sliding_window_counter, algorithm::fixed_window}) {
    for (nanoseconds w : {nanoseconds::max(), nanoseconds(1), nanoseconds(1001)}) {
      rule r{.name = std::string(to_string(a)) + std::to_string(w.count()),
             .limit = {.algorithm = a, .limit = 2, .window = w}};
      EXPECT_TRUE(expect_decision(b->check({.rule = prepared(*b, r).get(), .key = "k"})).allowed) << r.name;
      decision d = expect_decision(b->check({.rule = prepared(*b, r).get(), .key = "k"}));
      EXPECT_EQ(d.source, decision_source::limiter) << r.name;
      if (w == nanoseconds::max()) {
        EXPECT_FALSE(expect_decision(b->check({.rule = prepared(*b, r).get(), .key = "k"})).allowed) << r.name;
      }
    }
  }
  rule slow{.name = "slow", .limit = token_bucket_policy(per_second(0), std::int64_t{1} << 40)};
  EXPECT_TRUE(expect_decision(b->check({.rule = prepared(*b, slow).get(), .key = "k", .cost = 1000})).allowed);
  // Every key expires (the 1 µs windows' keys within a millisecond: -2 once gone).
  for (const auto& k : redis_->keys()) EXPECT_NE(redis_->integer({"PTTL", k}), -1) << k;
  EXPECT_EQ(b->stats().protocol_errors, 0u);

  const auto before = redis_->integer({"DBSIZE"});
  rule huge_limit{.name = "huge", .limit = fixed_window_policy(std::numeric_limits<std::int64_t>::max(), 1s)};
  rule huge_burst{.name = "burst",
                  .limit = token_bucket_policy(per_second(1), std::numeric_limits<std::int64_t>::max())};
  for (const rule* r : {&huge_limit, &huge_burst}) {
    auto p = b->prepare(*r);
    ASSERT_FALSE(p.ok()) << r->name;
    EXPECT_EQ(p.error(), errc::invalid_argument) << r->name;
  }
  EXPECT_EQ(redis_->integer({"DBSIZE"}), before);
}

// Dual-layer decisions are built by combine_layers from each layer's figures, as in process:
// the binding layer, its limit, and retry_after from the refusing layer(s) only.
TEST_F(RedisBackendTest, DualLayerDecisionsAreCombinedAsInProcess) {
  auto b = make();
  auto memory = make_memory_backend({.clock = &clock_}).value();
  rule r{.name = "api", .limit = sliding_window_policy(3, 1min), .tenant = token_bucket_policy(per_second(1), 6)};
  const testing::twin_rules twins(*b, *memory, {r});
  auto both = [&](std::string_view user, std::int64_t cost, const std::string& where) {
    check_request req{.rule = twins.on_a[0].get(), .tenant = "acme", .user = user, .cost = cost};
    decision d = expect_decision(b->check(req));
    expect_same(d, memory->check(twins.on_b_of(req)).value(), where);
    return d;
  };
  decision d = both("alice", 1, "alice takes 1");
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.binding, layer::user);  // alice 2 left, tenant 5
  EXPECT_EQ(d.limit, 3);
  EXPECT_TRUE(both("bob", 3, "bob takes 3").allowed);
  d = both("carol", 1, "carol takes 1");
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.binding, layer::tenant);  // tenant 1 left, carol 2
  EXPECT_EQ(d.limit, 6);
  EXPECT_EQ(d.remaining, 1);
  // The tenant refuses; alice's layer would admit: retry_after is the tenant's alone (1 s for the
  // missing token), and alice keeps her 2 units.
  d = both("alice", 2, "tenant refuses");
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.rejected_by, layer::tenant);
  EXPECT_EQ(d.binding, layer::tenant);
  EXPECT_EQ(d.limit, 6);
  EXPECT_EQ(d.user.remaining, 2);
  EXPECT_EQ(d.retry_after, 1s);
  // Alice's own layer refuses while the tenant would admit.
  clock_.advance(10s);
  EXPECT_TRUE(both("alice", 2, "alice takes 2").allowed);
  d = both("alice", 1, "user refuses");
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.rejected_by, layer::user);
  EXPECT_EQ(d.binding, layer::user);
  EXPECT_EQ(d.limit, 3);
  EXPECT_EQ(d.retry_after, 50s);  // her first admission leaves the minute
}

// On a stopped io_context nothing runs the backend's strand: destroying the backend must still
// close its connection, or every such backend leaks a socket.
TEST_F(RedisBackendTest, DestroyingOnAStoppedIoContextClosesTheConnection) {
  auto open_fds = [] {
    return std::distance(std::filesystem::directory_iterator("/proc/self/fd"), std::filesystem::directory_iterator{});
  };
  asio::io_context io;
  asio::steady_timer reactor_up(io);  // the io_context's own fds (epoll, eventfd, timerfd) exist from here
  rule r{.name = "r", .limit = fixed_window_policy(100, 1min)};
  const auto before = open_fds();
  for (int i = 0; i < 3; ++i) {
    io.restart();
    auto work = asio::make_work_guard(io);
    std::thread runner([&] { io.run(); });
    auto b =
        make_redis_backend({.addresses = {redis_->address()}, .command_timeout = 2s, .clock_for_test = &clock_}, io);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(expect_decision((*b)->check({.rule = prepared(**b, r).get(), .key = "k"})).source,
              decision_source::limiter);  // connected
    io.stop();
    runner.join();
    ASSERT_TRUE(io.stopped());
    b->reset();  // destroyed on a stopped io_context
  }
  EXPECT_EQ(open_fds(), before);
}

class RedisAuthTest : public ::testing::Test {};

TEST_F(RedisAuthTest, RequirePassAndAclUser) {
  redis_server redis({"--requirepass", "s3cret"});
  redis.set_password("", "s3cret");
  redis.command({"ACL", "SETUSER", "limiter", "on", ">limiter-pw", "~sluice:*", "+@all"});
  rule r{.name = "r", .limit = fixed_window_policy(5, 1min)};
  {
    auto b = make_redis_backend({.addresses = {redis.address()}, .password = "s3cret", .command_timeout = 2s});
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(expect_decision((*b)->check({.rule = prepared(**b, r).get(), .key = "k"})).source,
              decision_source::limiter);
    EXPECT_TRUE((*b)->ready());
  }
  {
    auto b = make_redis_backend(
        {.addresses = {redis.address()}, .username = "limiter", .password = "limiter-pw", .command_timeout = 2s});
    ASSERT_TRUE(b.ok());
    decision d = expect_decision((*b)->check({.rule = prepared(**b, r).get(), .key = "k"}));
    EXPECT_EQ(d.source, decision_source::limiter);
    EXPECT_EQ(d.remaining, 3);
  }
  {
    // Wrong password: Redis refuses, the decision follows on_error, nothing crashes.
    auto b = make_redis_backend({.addresses = {redis.address()}, .password = "wrong", .command_timeout = 2s});
    ASSERT_TRUE(b.ok());
    decision d = expect_decision((*b)->check({.rule = prepared(**b, r).get(), .key = "k"}));
    EXPECT_EQ(d.source, decision_source::fail_open);
    EXPECT_TRUE(d.allowed);
    EXPECT_FALSE((*b)->ready());
  }
  {
    // No password at all.
    auto b =
        make_redis_backend({.addresses = {redis.address()}, .command_timeout = 2s, .on_error = failure_policy::deny});
    ASSERT_TRUE(b.ok());
    decision d = expect_decision((*b)->check({.rule = prepared(**b, r).get(), .key = "k"}));
    EXPECT_EQ(d.source, decision_source::fail_closed);
    EXPECT_FALSE(d.allowed);
  }
}

}  // namespace
}  // namespace sluice
