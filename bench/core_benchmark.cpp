// SPDX-License-Identifier: Apache-2.0
// Microbenchmarks of the in-process core. `make bench` runs them; the README quotes them.
#include <benchmark/benchmark.h>

#include <atomic>
#include <charconv>
#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "sluice/dual_layer.hpp"
#include "sluice/keyed.hpp"
#include "sluice/memory_backend.hpp"
#include "sluice/testing/simulated_clock.hpp"
#include "sluice/token_bucket.hpp"
#include "sluice/window_limiter.hpp"

namespace {

using namespace std::chrono_literals;
using sluice::time_point;

constexpr time_point t0 = time_point(std::chrono::seconds(1000));

// --- clocks ------------------------------------------------------------------------------------------

void BM_Clock_SteadyClockNow(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(sluice::real_clock().now());
}
BENCHMARK(BM_Clock_SteadyClockNow);

void BM_Clock_CoarseClockNow(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(sluice::coarse_clock().now());
  state.counters["resolution_ns"] = static_cast<double>(sluice::coarse_clock_resolution().count());
}
BENCHMARK(BM_Clock_CoarseClockNow);

// --- token bucket ------------------------------------------------------------------------------------

// Admitted path: 10^9 per second, `now` advancing 1 ns per check, so every check is admitted.
// Every check admitted: one token every 4 ns, and `now` moves 4 ns a check (the admitted share
// is reported, so a bucket that refused instead would show).
void BM_TokenBucket_TryAcquireNowPassedIn(benchmark::State& state) {
  auto b = sluice::token_bucket::create({.rate = sluice::per_second(2.5e8), .burst = 1000}).value();
  time_point now = t0;
  std::int64_t admitted = 0;
  for (auto _ : state) {
    now += 4ns;
    admitted += b.try_acquire(now, 1).value().allowed;
  }
  state.counters["admitted_share"] = static_cast<double>(admitted) / static_cast<double>(state.iterations());
}
BENCHMARK(BM_TokenBucket_TryAcquireNowPassedIn);

void BM_TokenBucket_Refused(benchmark::State& state) {
  auto b = sluice::token_bucket::create({.rate = sluice::per_second(1), .burst = 1}).value();
  (void)b.try_acquire(t0, 1);
  for (auto _ : state) benchmark::DoNotOptimize(b.try_acquire(t0, 1));
}
BENCHMARK(BM_TokenBucket_Refused);

// Two threads on one bucket: every check is a contended compare-and-swap.
sluice::token_bucket shared_bucket =
    sluice::token_bucket::create({.rate = sluice::per_second(1e9), .burst = 1'000'000}).value();
void BM_TokenBucket_TwoThreadsOneBucket(benchmark::State& state) {
  time_point now = t0;
  for (auto _ : state) {
    now += 1ns;
    benchmark::DoNotOptimize(shared_bucket.try_acquire(now, 1));
  }
}
BENCHMARK(BM_TokenBucket_TwoThreadsOneBucket)->Threads(2)->UseRealTime();

void BM_TokenBucket_TryAcquireSteadyClock(benchmark::State& state) {
  auto b = sluice::token_bucket::create({.rate = sluice::per_second(1e9), .burst = 1'000'000}).value();
  for (auto _ : state) benchmark::DoNotOptimize(b.try_acquire(1));
}
BENCHMARK(BM_TokenBucket_TryAcquireSteadyClock);

void BM_TokenBucket_TryAcquireCoarseClock(benchmark::State& state) {
  auto b = sluice::token_bucket::create(
               {.rate = sluice::per_second(1e9), .burst = 1'000'000, .clock = &sluice::coarse_clock()})
               .value();
  for (auto _ : state) benchmark::DoNotOptimize(b.try_acquire(1));
}
BENCHMARK(BM_TokenBucket_TryAcquireCoarseClock);

// A fast limiter that grants the wrong rate has failed: two threads hammer a 200,000/s bucket on
// the real clock; effective_rate must match configured_rate (plus the initial burst of 100).
sluice::token_bucket rate_bucket =
    sluice::token_bucket::create({.rate = sluice::per_second(200'000), .burst = 100}).value();
void BM_TokenBucket_EffectiveRate(benchmark::State& state) {
  const auto start = std::chrono::steady_clock::now();
  std::int64_t admitted = 0;
  for (auto _ : state) admitted += rate_bucket.try_acquire(1).value().allowed;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Counters are summed over threads: the sum of admitted_per_s is the bucket's effective rate.
  state.counters["admitted_per_s"] = static_cast<double>(admitted) / seconds;
  state.counters["configured_per_s"] = benchmark::Counter(200'000, benchmark::Counter::kAvgThreads);
}
BENCHMARK(BM_TokenBucket_EffectiveRate)->Threads(2)->UseRealTime()->MinTime(1.0);

// --- keyed -------------------------------------------------------------------------------------------

// 1,000,000 keys, random access, `now` passed in. Each key is formatted into a local buffer, as a
// service has it fresh from the request, rather than read from a 32 MB array of strings.
void BM_KeyedTokenBucket_RandomKeys(benchmark::State& state) {
  const auto n = static_cast<std::uint32_t>(state.range(0));
  auto k = sluice::keyed_limiter::create(
               {.policy = sluice::token_bucket_policy(sluice::per_second(1), 1'000'000), .max_keys = n})
               .value();
  char key[32] = "user:";
  auto format = [&](std::uint32_t id) {
    char* end = std::to_chars(key + 5, key + sizeof key, id).ptr;
    return std::string_view(key, static_cast<std::size_t>(end - key));
  };
  for (std::uint32_t i = 0; i < n; ++i) (void)k->try_acquire(format(i), t0);
  std::mt19937_64 rng(7);
  std::vector<std::uint32_t> order(1 << 20);
  for (auto& o : order) o = static_cast<std::uint32_t>(rng() % n);
  std::size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(k->try_acquire(format(order[i++ & (order.size() - 1)]), t0));
  }
  state.counters["bytes_per_key"] = static_cast<double>(k->memory_bytes()) / static_cast<double>(k->size());
}
BENCHMARK(BM_KeyedTokenBucket_RandomKeys)->Arg(100'000)->Arg(1'000'000);

// --- windows and dual layer --------------------------------------------------------------------------

template <class Limiter>
void window_benchmark(benchmark::State& state) {
  auto l = Limiter::create({.limit = 1000, .window = 1s}).value();
  time_point now = t0;
  for (auto _ : state) {
    now += 1ms;  // one check per ms against 1000/s: admitted, and the log trims one entry per check
    benchmark::DoNotOptimize(l.try_acquire(now, 1));
  }
}
void BM_SlidingWindowLog_TryAcquire(benchmark::State& s) { window_benchmark<sluice::sliding_window_log>(s); }
void BM_SlidingWindowCounter_TryAcquire(benchmark::State& s) { window_benchmark<sluice::sliding_window_counter>(s); }
void BM_FixedWindow_TryAcquire(benchmark::State& s) { window_benchmark<sluice::fixed_window>(s); }
BENCHMARK(BM_SlidingWindowLog_TryAcquire);
BENCHMARK(BM_SlidingWindowCounter_TryAcquire);
BENCHMARK(BM_FixedWindow_TryAcquire);

void BM_DualLayer_TryAcquire(benchmark::State& state) {
  auto d = sluice::dual_layer::create({.tenant = sluice::sliding_window_counter_policy(1000, 1s),
                                       .user = sluice::token_bucket_policy(sluice::per_second(1000), 10)})
               .value();
  time_point now = t0;
  for (auto _ : state) {
    now += 1ms;
    benchmark::DoNotOptimize(d.try_acquire(now, 1));
  }
}
BENCHMARK(BM_DualLayer_TryAcquire);

// --- the memory backend: the check path sluiced and the middleware take ------------------------------

// backend::check of a prepared rule over 1,000 keys (the table stays warm: this is the cost of the check
// path itself, where BM_KeyedTokenBucket_RandomKeys measures a big table): the request
// validated once, then the rule's table. Arg 1: a dual-layer rule (1,000 tenants).
void BM_MemoryBackend_Check(benchmark::State& state) {
  const bool dual = state.range(0) == 1;
  sluice::testing::simulated_clock clock(t0);
  auto b = sluice::make_memory_backend({.clock = &clock}).value();
  sluice::rule r{.name = "api", .limit = sluice::token_bucket_policy(sluice::per_second(1), 1'000'000)};
  if (dual) r.tenant = sluice::token_bucket_policy(sluice::per_second(1), 1'000'000'000);
  const sluice::prepared_rule_ptr api = b->prepare(r).value();
  char key[32] = "user:";
  auto format = [&](std::uint32_t id) {
    char* end = std::to_chars(key + 5, key + sizeof key, id).ptr;
    return std::string_view(key, static_cast<std::size_t>(end - key));
  };
  std::mt19937_64 rng(7);
  std::vector<std::uint32_t> order(1 << 20);
  for (auto& o : order) o = static_cast<std::uint32_t>(rng() % 1000);
  const std::string tenants[] = {"acme", "globex", "initech", "umbrella"};
  std::size_t i = 0;
  for (auto _ : state) {
    const std::uint32_t id = order[i++ & (order.size() - 1)];
    sluice::check_request req{.rule = api.get(), .key = format(id)};
    if (dual) {
      req.tenant = tenants[id & 3];
      req.user = req.key;
      req.key = {};
    }
    benchmark::DoNotOptimize(b->check(req));
  }
}
BENCHMARK(BM_MemoryBackend_Check)->Arg(0)->Arg(1);

}  // namespace

BENCHMARK_MAIN();
