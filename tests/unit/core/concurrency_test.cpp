// SPDX-License-Identifier: Apache-2.0
// Real threads, frozen simulated time, exact expected totals. Also built and run under TSan.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "sluice/dual_layer.hpp"
#include "sluice/keyed.hpp"
#include "sluice/memory_backend.hpp"
#include "sluice/testing/simulated_clock.hpp"
#include "sluice/token_bucket.hpp"
#include "sluice/window_limiter.hpp"

namespace sluice {
namespace {

using namespace std::chrono_literals;

constexpr time_point t0 = time_point(std::chrono::seconds(600));
constexpr int threads = 4;
constexpr int attempts_per_thread = 5'000;

// Runs `attempt` attempts_per_thread times on each of `threads` threads released together and
// returns how many were admitted.
int hammer(const std::function<bool(int thread, int i)>& attempt) {
  std::atomic<int> admitted{0};
  std::atomic<bool> go{false};
  std::vector<std::jthread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      int mine = 0;
      for (int i = 0; i < attempts_per_thread; ++i) mine += attempt(t, i) ? 1 : 0;
      admitted.fetch_add(mine);
    });
  }
  go.store(true, std::memory_order_release);
  pool.clear();  // joins
  return admitted.load();
}

TEST(Concurrency, TokenBucketAdmitsExactlyBurstAtFrozenTime) {
  auto b = token_bucket::create({.rate = per_second(5), .burst = 1000}).value();
  EXPECT_EQ(hammer([&](int, int) { return b.try_acquire(t0).value().allowed; }), 1000);
}

TEST(Concurrency, TokenBucketReservationsAreExact) {
  auto b = token_bucket::create({.rate = per_second(1), .burst = 100}).value();
  hammer([&](int, int) { return b.reserve(t0, 1).ok(); });
  EXPECT_EQ(b.tokens(t0), 100 - threads * attempts_per_thread);
}

TEST(Concurrency, TokenBucketCancelsNeverGiveBackMoreThanReserved) {
  auto b = token_bucket::create({.rate = per_second(1), .burst = 100}).value();
  hammer([&](int, int) {
    auto r = b.reserve(t0, 1);
    b.cancel(r.value(), t0);
    return true;
  });
  // As x/time/rate's CancelAt, a cancel gives back its tokens less those reserved after it, so
  // interleaved reservations may lose tokens (until refilled), but never create any.
  EXPECT_LE(b.tokens(t0), 100);
  EXPECT_EQ(b.tokens(t0 + std::chrono::seconds(100 + threads * attempts_per_thread)), 100);
}

TEST(Concurrency, TokenBucketSetRateWhileChecking) {
  auto b = token_bucket::create({.rate = per_second(5), .burst = 100}).value();
  std::atomic<bool> stop{false};
  std::jthread changer([&] {
    for (int i = 0; !stop.load(); ++i) (void)b.set_rate(per_second(i % 2 ? 5 : 10), t0);
  });
  int admitted = hammer([&](int, int) { return b.try_acquire(t0).value().allowed; });
  stop = true;
  // Rate changes keep the tokens held: at frozen time no more than the burst is ever admitted.
  EXPECT_LE(admitted, 100);
  EXPECT_GE(admitted, 1);
}

// Changes seal the current block while checks, reservations and cancels race on it; at frozen time
// the bucket never holds more than its burst, and every check answers from one parameter set.
TEST(Concurrency, TokenBucketChangesWhileReservingAndCancelling) {
  auto b = token_bucket::create({.rate = per_second(5), .burst = 100}).value();
  std::atomic<bool> stop{false};
  std::jthread changer([&] {
    for (int i = 0; !stop.load(); ++i) {
      (void)(i % 3 ? b.set_rate(per_second(i % 2 ? 5 : 10), t0) : b.set_burst(i % 2 ? 100 : 50, t0));
    }
  });
  hammer([&](int t, int i) {
    if (t % 2) return b.try_acquire(t0).value().allowed;
    auto r = b.reserve(t0, 1);
    if (i % 2) b.cancel(r.value(), t0);
    return true;
  });
  stop = true;
  changer.join();
  EXPECT_LE(b.tokens(t0), b.burst());
}

TEST(Concurrency, SlidingWindowLogAdmitsExactlyLimit) {
  auto log = sliding_window_log::create({.limit = 1000, .window = 60s}).value();
  EXPECT_EQ(hammer([&](int, int) { return log.try_acquire(t0).value().allowed; }), 1000);
}

TEST(Concurrency, CountersAdmitExactlyLimit) {
  auto c = sliding_window_counter::create({.limit = 777, .window = 60s}).value();
  EXPECT_EQ(hammer([&](int, int) { return c.try_acquire(t0).value().allowed; }), 777);
  auto q = fixed_window::create({.limit = 555, .window = 60s}).value();
  EXPECT_EQ(hammer([&](int, int) { return q.try_acquire(t0).value().allowed; }), 555);
}

TEST(Concurrency, DualLayerAdmitsExactlyTheBindingLimit) {
  auto d =
      dual_layer::create({.tenant = sliding_window_policy(300, 60s), .user = sliding_window_policy(1000, 60s)}).value();
  EXPECT_EQ(hammer([&](int, int) { return d.try_acquire(t0).value().allowed; }), 300);
}

TEST(Concurrency, KeyedLimiterExactPerKeyWhileTheTableGrows) {
  // Four hot keys hammered while 20,000 new keys make every shard grow and rehash.
  auto k = keyed_limiter::create({.policy = token_bucket_policy(per_second(1), 100)}).value();
  int hot = hammer([&](int t, int i) {
    EXPECT_TRUE(k->try_acquire("new:" + std::to_string(t) + ":" + std::to_string(i), t0).value().allowed);
    return k->try_acquire("hot:" + std::to_string(i % 4), t0).value().allowed;
  });
  EXPECT_EQ(hot, 400);
  EXPECT_EQ(k->size(), 4u + threads * attempts_per_thread);
}

// A limit raised while checks run: every check sees its shard's limits before or after, so no key
// is admitted beyond the larger limit, and after the change the larger limit holds exactly.
TEST(Concurrency, KeyedLimiterRetunedWhileChecking) {
  auto k = keyed_limiter::create({.policy = fixed_window_policy(100, 60s)}).value();
  std::unique_ptr<keyed_limiter> raised;
  std::atomic<keyed_limiter*> in_use{k.get()};
  int admitted = hammer([&](int t, int i) {
    if (t == 0 && i == attempts_per_thread / 2) {
      raised = keyed_limiter::retuned(*k, fixed_window_policy(300, 60s), t0).value();
      in_use.store(raised.get());
    }
    return in_use.load()->try_acquire("hot:" + std::to_string(i % 2), t0).value().allowed;
  });
  EXPECT_EQ(admitted, 600) << "each of the two keys admits exactly its raised limit";
  // Overrides: the same keys under other limits, concurrently with checks under the rule's.
  auto limits = k->limits_for(fixed_window_policy(50, 60s)).value();
  int overridden = hammer([&](int t, int i) {
    return k->try_acquire("o:" + std::to_string(i % 3), t0, 1, t % 2 ? &limits : nullptr).value().allowed;
  });
  // One count per key whichever limits a check used: the rule's checks (300 since the retune)
  // fill each key, and the override's (50) admit nothing beyond.
  EXPECT_EQ(overridden, 900);
  EXPECT_FALSE(k->try_acquire("o:0", t0, 1, &limits).value().allowed);
}

TEST(Concurrency, MemoryBackendDualLayerAcrossUsers) {
  testing::simulated_clock clock(t0);
  auto backend = make_memory_backend({.clock = &clock}).value();
  auto r = backend
               ->prepare({.name = "tenant_api",
                          .limit = sliding_window_policy(100, 60s),
                          .tenant = sliding_window_policy(1000, 60s)})
               .value();
  int admitted = hammer([&](int t, int i) {
    std::string user = "u" + std::to_string((t * attempts_per_thread + i) % 50);
    return backend->check({.rule = r.get(), .tenant = "acme", .user = user}).value().allowed;
  });
  EXPECT_EQ(admitted, 1000);  // 50 users × 100 would be 5000: the tenant layer binds
}

}  // namespace
}  // namespace sluice
