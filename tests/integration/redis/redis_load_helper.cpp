// SPDX-License-Identifier: Apache-2.0
// A second process for the exactness tests: THREADS threads each run CHECKS blocking checks against
// one key (or one tenant) on the Redis at ADDRESS, then it prints
//   admitted N failed M calls C windows I:n I:n ...
// where C is the script calls it sent and each I:n the admissions it counted in the fixed window
// of index I (the lease modes, whose rules count in 60 s fixed windows; 0 for the other modes).
//   redis_load_helper ADDRESS log|dual|lease|lease-dual THREADS CHECKS
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "sluice/redis_backend.hpp"

namespace {

using namespace std::chrono_literals;
constexpr auto window = 60s;

// The index of the fixed window an admission counted in: its end is reset_after from now (Unix
// time, as Redis's TIME), give or take the reply's latency.
long long window_index(const sluice::decision& d) {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  const double end = std::chrono::duration<double>(now + d.reset_after).count();
  return std::llround(end / std::chrono::duration<double>(window).count()) - 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s ADDRESS log|dual|lease|lease-dual THREADS CHECKS\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[2];
  const int threads = std::atoi(argv[3]);
  const int checks = std::atoi(argv[4]);
  if (threads < 1 || threads > 64 || checks < 1 || checks > 1'000'000) return 2;
  // A long timeout and fail-closed: a slow (sanitized) run can only under-admit, and reports it.
  auto backend = sluice::make_redis_backend(
      {.addresses = {argv[1]}, .command_timeout = 10s, .on_error = sluice::failure_policy::deny});
  if (!backend) {
    std::fprintf(stderr, "%s\n", backend.error().message.c_str());
    return 1;
  }
  const bool dual_mode = mode == "dual" || mode == "lease-dual";
  sluice::rule r;
  if (mode == "log") {
    r = {.name = "exact", .limit = sluice::sliding_window_policy(1000, 60s)};
  } else if (mode == "dual") {
    r = {.name = "exact-dual",
         .limit = sluice::sliding_window_policy(400, 60s),
         .tenant = sluice::sliding_window_policy(1000, 60s)};
  } else if (mode == "lease") {
    r = {.name = "leased", .limit = sluice::fixed_window_policy(1000, window)};
    r.lease = sluice::lease_policy{.period = 200ms, .max_share = 0.1};
  } else if (mode == "lease-dual") {
    // Both layers in the same windows: a decision's reset_after (the later layer's) is the window's end.
    r = {.name = "leased-dual",
         .limit = sluice::fixed_window_policy(400, window),
         .tenant = sluice::fixed_window_policy(1000, window)};
    r.lease = sluice::lease_policy{.period = 200ms, .max_share = 0.1};
  } else {
    return 2;
  }
  auto prepared = (*backend)->prepare(r);
  if (!prepared) {
    std::fprintf(stderr, "%s\n", prepared.error().message.c_str());
    return 1;
  }
  std::atomic<long> admitted{0};
  std::atomic<long> failed{0};
  std::mutex windows_mutex;
  std::map<long long, long> windows;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const std::string user = "user-" + std::to_string(::getpid()) + "-" + std::to_string(t);
      std::map<long long, long> mine;
      for (int i = 0; i < checks; ++i) {
        sluice::check_request req{.rule = prepared->get()};
        if (dual_mode) {
          req.tenant = "acme";
          req.user = user;
        } else {
          req.key = "one-key";
        }
        auto d = (*backend)->check(req);
        if (!d || d->source != sluice::decision_source::limiter) {
          failed.fetch_add(1);
        } else if (d->allowed) {
          admitted.fetch_add(1);
          ++mine[mode.starts_with("lease") ? window_index(*d) : 0];
        }
      }
      std::lock_guard lock(windows_mutex);
      for (auto [w, n] : mine) windows[w] += n;
    });
  }
  for (auto& th : pool) th.join();
  std::printf("admitted %ld failed %ld calls %llu windows", admitted.load(), failed.load(),
              static_cast<unsigned long long>((*backend)->stats().calls));
  for (auto [w, n] : windows) std::printf(" %lld:%ld", w, n);
  std::printf("\n");
  return 0;
}
