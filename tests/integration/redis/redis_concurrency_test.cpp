// SPDX-License-Identifier: Apache-2.0
// Exactness under concurrency on a real redis-server: 2 processes × 4 threads × 5,000 checks at one
// key with a limit of 1,000 per 60 s admit exactly 1,000; a dual-layer tenant limit holds exactly
// too. Also runs under ThreadSanitizer (label `concurrency`).
#include "sluice/redis_backend.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <sstream>
#include <thread>

#include "integration/redis/redis_server.hpp"

namespace sluice {
namespace {

using namespace std::chrono_literals;

struct helper_result {
  long admitted = -1;
  long failed = -1;
  unsigned long long calls = 0;
  std::map<long long, long> windows;  // admissions by fixed window index (mode lease)
};

// Starts the helper binary; returns its pid and the read end of its stdout.
std::pair<pid_t, int> spawn_helper(const std::string& address, const char* mode, int threads, int checks) {
  int fds[2];
  if (::pipe(fds) != 0) return {-1, -1};
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], STDOUT_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    std::string t = std::to_string(threads);
    std::string c = std::to_string(checks);
    ::execl(SLUICE_REDIS_LOAD_HELPER, SLUICE_REDIS_LOAD_HELPER, address.c_str(), mode, t.c_str(), c.c_str(),
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(fds[1]);
  return {pid, fds[0]};
}

helper_result wait_helper(pid_t pid, int fd) {
  std::string out;
  char buf[256];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  int status = 0;
  ::waitpid(pid, &status, 0);
  helper_result r;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "helper exited with " << status << ": " << out;
  int used = 0;
  if (std::sscanf(out.c_str(), "admitted %ld failed %ld calls %llu windows%n", &r.admitted, &r.failed, &r.calls,
                  &used) != 3) {
    ADD_FAILURE() << out;
    return r;
  }
  std::istringstream rest(out.substr(static_cast<std::size_t>(used)));
  for (std::string w; rest >> w;) {
    const std::size_t colon = w.find(':');
    r.windows[std::stoll(w.substr(0, colon))] += std::stol(w.substr(colon + 1));
  }
  return r;
}

helper_result run_two_processes(const std::string& address, const char* mode, int threads, int checks) {
  auto [p1, f1] = spawn_helper(address, mode, threads, checks);
  auto [p2, f2] = spawn_helper(address, mode, threads, checks);
  EXPECT_GT(p1, 0);
  EXPECT_GT(p2, 0);
  helper_result a = wait_helper(p1, f1);
  helper_result b = wait_helper(p2, f2);
  for (auto [w, n] : b.windows) a.windows[w] += n;
  return {a.admitted + b.admitted, a.failed + b.failed, std::max(a.calls, b.calls), std::move(a.windows)};
}

TEST(RedisConcurrencyTest, TwoProcessesFourThreadsAdmitExactlyTheLimit) {
  testing::redis_server redis;
  helper_result r = run_two_processes(redis.address(), "log", 4, 5000);
  EXPECT_EQ(r.failed, 0);
  EXPECT_EQ(r.admitted, 1000);
  // Units, not entries: admissions in one µs (a batch shares its `now`) share an entry.
  EXPECT_EQ(redis.log_units("sluice:{exact:one-key}:swl.60000000"), 1000);
}

TEST(RedisConcurrencyTest, DualLayerTenantLimitIsExactAcrossProcesses) {
  testing::redis_server redis;
  // 8 users of one tenant, 400 each at most: the tenant's 1,000 binds.
  helper_result r = run_two_processes(redis.address(), "dual", 4, 1000);
  EXPECT_EQ(r.failed, 0);
  EXPECT_EQ(r.admitted, 1000);
  EXPECT_EQ(redis.log_units("sluice:{acme}:exact-dual:swl.60000000"), 1000);
}

// No window admitted more than `limit`, and the fullest at least `limit - bound`.
void expect_windows_within(const helper_result& r, long limit, long bound) {
  long fullest = 0;
  for (auto [w, n] : r.windows) {
    EXPECT_LE(n, limit) << "window " << w;
    fullest = std::max(fullest, n);
  }
  EXPECT_GE(fullest, limit - bound);
}

// Leases: 2 processes × 4 threads at one hot key, 1,000 per 60 s fixed window, max_share 0.1. No
// window ever admits more than 1,000; the fullest admits at least 1,000 less what the two can
// hold (100 each); and each process pays far fewer Redis calls than checks (refusals are answered
// from memory until the window ends).
TEST(RedisConcurrencyTest, LeasedHotKeyAcrossProcessesNeverExceedsTheLimit) {
  testing::redis_server redis;
  constexpr int threads = 4, checks = 5000;
  helper_result r = run_two_processes(redis.address(), "lease", threads, checks);
  EXPECT_EQ(r.failed, 0);
  expect_windows_within(r, 1000, 2 * 100);
  EXPECT_LT(r.calls, threads * checks / 10u) << "Redis calls of the busier process";
}

TEST(RedisConcurrencyTest, LeasedTenantLayerIsNeverExceededAcrossProcesses) {
  testing::redis_server redis;
  // 8 users of one tenant, 400 each at most per window: the tenant's leased 1,000 binds.
  helper_result r = run_two_processes(redis.address(), "lease-dual", 4, 1000);
  EXPECT_EQ(r.failed, 0);
  expect_windows_within(r, 1000, 2 * 100);
}

TEST(RedisConcurrencyTest, ThreadsSharingOneBackendMixBlockingAndAsyncChecks) {
  testing::redis_server redis;
  auto backend =
      make_redis_backend({.addresses = {redis.address()}, .command_timeout = 10s, .on_error = failure_policy::deny});
  ASSERT_TRUE(backend.ok());
  rule r{.name = "shared", .limit = fixed_window_policy(300, std::chrono::hours(24))};
  std::atomic<int> admitted{0};
  std::atomic<int> failed{0};
  std::atomic<int> async_done{0};
  constexpr int threads = 4;
  constexpr int per_thread = 200;
  std::vector<std::thread> pool;
  const prepared_rule_ptr shared = (*backend)->prepare(r).value();  // one prepared rule for every thread
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (int i = 0; i < per_thread; ++i) {
        auto count = [&](result<decision> d) {
          if (!d || d->source != decision_source::limiter) {
            failed.fetch_add(1);
          } else if (d->allowed) {
            admitted.fetch_add(1);
          }
        };
        if (i % 2 == 0) {
          count((*backend)->check({.rule = shared.get(), .key = "k"}));
        } else {
          (*backend)->async_check({.rule = shared.get(), .key = "k"}, [&, count](result<decision> d) {
            count(std::move(d));
            async_done.fetch_add(1);
          });
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  for (int i = 0; i < 1000 && async_done.load() < threads * per_thread / 2; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(async_done.load(), threads * per_thread / 2);
  EXPECT_EQ(failed.load(), 0);
  // The day-long window might straddle a day boundary only if the test ran across midnight UTC.
  EXPECT_EQ(admitted.load(), 300);
  auto s = (*backend)->stats();
  EXPECT_EQ(s.redis_decisions, static_cast<std::uint64_t>(threads * per_thread));
  EXPECT_EQ(s.pending, 0u);
}

}  // namespace
}  // namespace sluice
