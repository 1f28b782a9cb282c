// A second process for the exactness test: THREADS threads each run CHECKS blocking checks against
// one key on the Redis at ADDRESS, then it prints "admitted N failed M".
//   redis_load_helper ADDRESS log|dual THREADS CHECKS
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "sluice/redis_backend.hpp"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s ADDRESS log|dual THREADS CHECKS\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[2];
  const int threads = std::atoi(argv[3]);
  const int checks = std::atoi(argv[4]);
  if (threads < 1 || threads > 64 || checks < 1 || checks > 1'000'000) return 2;
  using namespace std::chrono_literals;
  // A long timeout and fail-closed: a slow (sanitized) run can only under-admit, and reports it.
  auto backend = sluice::make_redis_backend(
      {.addresses = {argv[1]}, .command_timeout = 10s, .on_error = sluice::failure_policy::deny});
  if (!backend) {
    std::fprintf(stderr, "%s\n", backend.error().message.c_str());
    return 1;
  }
  const sluice::rule log{.name = "exact", .limit = sluice::sliding_window_policy(1000, 60s)};
  const sluice::rule dual{.name = "exact-dual",
                          .limit = sluice::sliding_window_policy(400, 60s),
                          .tenant = sluice::sliding_window_policy(1000, 60s)};
  std::atomic<long> admitted{0};
  std::atomic<long> failed{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const std::string user = "user-" + std::to_string(::getpid()) + "-" + std::to_string(t);
      for (int i = 0; i < checks; ++i) {
        auto d = mode == "dual" ? (*backend)->check({.rule = &dual, .tenant = "acme", .user = user})
                                : (*backend)->check({.rule = &log, .key = "one-key"});
        if (!d || d->source != sluice::decision_source::limiter) {
          failed.fetch_add(1);
        } else if (d->allowed) {
          admitted.fetch_add(1);
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  std::printf("admitted %ld failed %ld\n", admitted.load(), failed.load());
  return 0;
}
