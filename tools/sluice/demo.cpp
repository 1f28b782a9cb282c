// SPDX-License-Identifier: Apache-2.0
#include "demo.hpp"

#include <chrono>
#include <cstdarg>
#include <cstdio>

#include "sluice/testing/simulated_clock.hpp"
#include "sluice/token_bucket.hpp"
#include "sluice/window_limiter.hpp"

using namespace std::chrono_literals;

namespace sluice::cli {

namespace {

struct step {
  const char* what;
  std::chrono::milliseconds advance;  // before the step
  int requests;
  std::chrono::milliseconds spacing;  // between the step's requests
};

__attribute__((format(printf, 2, 3))) void pf(std::ostream& out, const char* format, ...) {
  char buf[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buf, sizeof buf, format, args);
  va_end(args);
  out << buf;
}

}  // namespace

int run_demo(std::ostream& out) {
  sluice::testing::simulated_clock clock;
  auto bucket = sluice::token_bucket::create({.rate = sluice::per_second(5), .burst = 60, .clock = &clock});
  if (!bucket) {
    pf(out, "%s\n", bucket.error().message.c_str());
    return 1;
  }
  const step steps[] = {
      {"a burst of 61 at t=0", 0ms, 61, 0ms},
      {"1 more, 200 ms later", 200ms, 1, 0ms},
      {"a script: 10 per second for 4 s", 100ms, 40, 100ms},
      {"idle for 60 s, then 70", 60s, 70, 0ms},
  };
  pf(out, "token bucket r=5/s b=60\n");
  pf(out, "%-34s %9s %8s %9s %10s %14s\n", "step", "t (ms)", "admitted", "refused", "remaining", "retry_after ms");
  auto start = clock.now();
  for (const step& s : steps) {
    clock.advance(s.advance);
    int admitted = 0, refused = 0;
    sluice::decision last{};
    for (int i = 0; i < s.requests; ++i) {
      if (i > 0) clock.advance(s.spacing);
      last = bucket->try_acquire(clock.now(), 1).value();
      (last.allowed ? admitted : refused)++;
    }
    pf(out, "%-34s %9lld %8d %9d %10lld %14lld\n", s.what,
       static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(clock.now() - start).count()),
       admitted, refused, static_cast<long long>(last.remaining),
       static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(last.retry_after).count()));
  }

  // The 2N pitfall: r = N/60 s, b = N admits about 2N in 60 s; a sliding window log admits N.
  constexpr int n = 100;
  sluice::testing::simulated_clock c2;
  auto tb = sluice::token_bucket::create({.rate = sluice::per_minute(n), .burst = n, .clock = &c2});
  auto log = sluice::sliding_window_log::create({.limit = n, .window = 60s, .clock = &c2});
  int tb_admitted = 0, log_admitted = 0;
  for (int ms = 0; ms < 60'000; ms += 100) {  // a client asking 10 times a second for 60 s
    tb_admitted += tb->try_acquire(c2.now()).value().allowed;
    log_admitted += log->try_acquire(c2.now()).value().allowed;
    c2.advance(100ms);
  }
  pf(out, "\n2N pitfall, N=%d per 60 s, 600 requests in 60 s:\n", n);
  pf(out, "  token bucket r=N/60s b=N admitted %d\n  sliding window log      admitted %d\n", tb_admitted, log_admitted);
  return 0;
}

}  // namespace sluice::cli
