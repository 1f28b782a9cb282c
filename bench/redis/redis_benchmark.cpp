// SPDX-License-Identifier: Apache-2.0
// Throughput, latency and Redis cost of each Redis-backend script.
//
//   redis_benchmark --address 127.0.0.1:6379 [--inflight 64] [--keys 100000] [--checks 300000]
//   redis_benchmark --cluster 127.0.0.1:7000,127.0.0.1:7001,... [...]   (a Redis Cluster's masters)
//   [--max-batch 64]   (redis_options::max_batch; 1: every check its own call)
//   [--only token_bucket]   (one script: token_bucket, sliding_window_log, sliding_window_counter, fixed_window)
//   redis_benchmark --script-body sliding_window_log     (prints that script, for redis-benchmark)
//
// For each algorithm (token bucket, sliding window log, sliding window counter, fixed window, dual
// layer): FLUSHALL; one check for each of `keys` keys, measuring Redis memory per key (INFO memory);
// CONFIG RESETSTAT; then `checks` checks over the same keys with `inflight` checks in flight on the
// one connection, measuring throughput, p50/p99 latency (client side, from async_check to its
// handler), this process's CPU time per check (getrusage: the client's cost, Redis runs apart) and
// the server time per call (INFO commandstats, usec_per_call of evalsha; on a cluster, each
// master's, which shows how evenly the keys spread), and the checks per script call (batching). Talks to the given
// Redis only; every loop is bounded by --checks.
#include <sys/resource.h>

#include <hiredis/hiredis.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <string>
#include <string_view>
#include <vector>

#include "redis/scripts.hpp"
#include "sluice/redis_backend.hpp"

namespace {

using steady = std::chrono::steady_clock;
using namespace std::chrono_literals;

struct options {
  std::string address = "127.0.0.1:6379";
  std::vector<std::string> cluster;  // the masters, when the backend is a cluster
  std::size_t max_batch = sluice::redis_options{}.max_batch;
  int inflight = 64;
  int keys = 100'000;
  long checks = 300'000;
  std::string only;  // one script's label, or all
};

std::string info_field(redisContext* c, const char* section, std::string_view field) {
  auto* r = static_cast<redisReply*>(redisCommand(c, "INFO %s", section));
  if (r == nullptr || r->type != REDIS_REPLY_STRING) {
    if (r) freeReplyObject(r);
    return {};
  }
  std::string text(r->str, r->len);
  freeReplyObject(r);
  auto pos = text.find(std::string(field) + ":");
  if (pos == std::string::npos) return {};
  pos += field.size() + 1;
  return text.substr(pos, text.find("\r\n", pos) - pos);
}

long long used_memory(redisContext* c) { return std::atoll(info_field(c, "memory", "used_memory").c_str()); }

// "calls=123,usec=456,usec_per_call=3.71,..." -> 3.71
double evalsha_usec_per_call(redisContext* c) {
  std::string s = info_field(c, "commandstats", "cmdstat_evalsha");
  auto pos = s.find("usec_per_call=");
  return pos == std::string::npos ? 0.0 : std::atof(s.c_str() + pos + 14);
}

// The server's CPU time so far (main thread, user + system), in seconds: what a check costs Redis
// in all, its reading and writing of the calls included.
double server_cpu_seconds(redisContext* c) {
  return std::atof(info_field(c, "cpu", "used_cpu_user_main_thread").c_str()) +
         std::atof(info_field(c, "cpu", "used_cpu_sys_main_thread").c_str());
}

void simple(redisContext* c, const char* cmd) {
  auto* r = static_cast<redisReply*>(redisCommand(c, cmd));
  if (r) freeReplyObject(r);
}

double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

struct run_result {
  double per_second = 0;
  double cpu_us = 0;  // this process's CPU time per check
  double p50_us = 0;
  double p99_us = 0;
  long failed = 0;
  long admitted = 0;
};

// `total` checks, `inflight` at a time, each handler starting the next one.
run_result drive(sluice::backend& b, const sluice::prepared_rule& r, const std::vector<std::string>& keys,
                 const std::vector<std::string>& tenants, long total, int inflight) {
  struct state {
    sluice::backend* b;
    const sluice::prepared_rule* r;
    const std::vector<std::string>* keys;
    const std::vector<std::string>* tenants;
    long total;
    std::atomic<long> started{0};
    std::atomic<long> finished{0};
    std::atomic<long> failed{0};
    std::atomic<long> admitted{0};
    std::vector<std::int64_t> latency_ns;
    std::promise<void> done;
  } st{&b, &r, &keys, &tenants, total};
  st.latency_ns.assign(static_cast<std::size_t>(total), 0);

  struct starter {
    static void next(state* s) {
      const long i = s->started.fetch_add(1);
      if (i >= s->total) return;
      const std::size_t k = static_cast<std::size_t>(i) % s->keys->size();
      const std::string& key = (*s->keys)[k];
      const auto t0 = steady::now();
      // Dual layer: about 1,000 tenants ("user:10000" ... "user:10999") of 100 users each.
      s->b->async_check({.rule = s->r, .key = key, .tenant = (*s->tenants)[k], .user = key},
                        [s, i, t0](sluice::result<sluice::decision> d) {
                          s->latency_ns[static_cast<std::size_t>(i)] = (steady::now() - t0).count();
                          if (!d || d->source != sluice::decision_source::limiter) {
                            s->failed.fetch_add(1, std::memory_order_relaxed);
                          } else if (d->allowed) {
                            s->admitted.fetch_add(1, std::memory_order_relaxed);
                          }
                          if (s->finished.fetch_add(1) + 1 == s->total) {
                            s->done.set_value();
                            return;
                          }
                          next(s);
                        });
    }
  };
  const auto start = steady::now();
  const double cpu_start = cpu_seconds();
  for (int i = 0; i < inflight; ++i) starter::next(&st);
  st.done.get_future().wait();
  const double seconds = std::chrono::duration<double>(steady::now() - start).count();
  const double cpu = cpu_seconds() - cpu_start;
  std::sort(st.latency_ns.begin(), st.latency_ns.end());
  run_result out;
  out.per_second = static_cast<double>(total) / seconds;
  out.cpu_us = cpu * 1e6 / static_cast<double>(total);
  out.p50_us = static_cast<double>(st.latency_ns[st.latency_ns.size() / 2]) / 1000.0;
  out.p99_us = static_cast<double>(st.latency_ns[st.latency_ns.size() * 99 / 100]) / 1000.0;
  out.failed = st.failed.load();
  out.admitted = st.admitted.load();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  if (argc == 3 && std::string_view(argv[1]) == "--script-body") {
    for (const auto& s : sluice::detail::scripts()) {
      if (s.name == argv[2]) {
        std::fputs(s.body.c_str(), stdout);
        return 0;
      }
    }
    std::fprintf(stderr, "no script named %s\n", argv[2]);
    return 2;
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string_view a = argv[i];
    if (a == "--address")
      o.address = argv[i + 1];
    else if (a == "--cluster") {
      for (std::string_view rest = argv[i + 1]; !rest.empty();) {
        const auto comma = rest.find(',');
        o.cluster.emplace_back(rest.substr(0, comma));
        rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
      }
    } else if (a == "--max-batch") {
      o.max_batch = static_cast<std::size_t>(std::atoi(argv[i + 1]));
    } else if (a == "--inflight")
      o.inflight = std::atoi(argv[i + 1]);
    else if (a == "--keys")
      o.keys = std::atoi(argv[i + 1]);
    else if (a == "--checks")
      o.checks = std::atol(argv[i + 1]);
    else if (a == "--only")
      o.only = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  const std::string_view labels[] = {"token_bucket", "sliding_window_log", "sliding_window_counter", "fixed_window",
                                     "dual_layer (2 logs)"};
  if (!o.only.empty() && std::find(std::begin(labels), std::end(labels), o.only) == std::end(labels)) {
    std::fprintf(stderr, "--only: no script named %s\n", o.only.c_str());
    return 2;
  }
  if (o.inflight < 1 || o.keys < 1 || o.checks < o.keys) {
    std::fprintf(stderr, "need inflight >= 1, keys >= 1, checks >= keys\n");
    return 2;
  }
  // One admin connection per server (on a cluster: per master), for INFO, FLUSHALL, RESETSTAT.
  std::vector<redisContext*> admins;
  for (const std::string& a : o.cluster.empty() ? std::vector<std::string>{o.address} : o.cluster) {
    const auto colon = a.rfind(':');
    redisContext* c = redisConnect(a.substr(0, colon).c_str(), std::atoi(a.c_str() + colon + 1));
    if (c == nullptr || c->err) {
      std::fprintf(stderr, "cannot connect to %s\n", a.c_str());
      return 1;
    }
    admins.push_back(c);
  }
  const sluice::redis_options ro{.addresses = o.cluster.empty() ? std::vector<std::string>{o.address} : o.cluster,
                                 .command_timeout = 1s,
                                 .max_batch = o.max_batch};
  auto backend = o.cluster.empty() ? sluice::make_redis_backend(ro) : sluice::make_redis_cluster_backend(ro);
  if (!backend) {
    std::fprintf(stderr, "%s\n", backend.error().message.c_str());
    return 1;
  }
  std::vector<std::string> keys;
  keys.reserve(static_cast<std::size_t>(o.keys));
  std::vector<std::string> tenants;
  for (int i = 0; i < o.keys; ++i) {
    keys.push_back("user:" + std::to_string(1'000'000 + i));
    tenants.push_back(keys.back().substr(0, 10));
  }

  // Limits high enough that most checks are admitted (admission is the costlier path: it writes);
  // the bucket refills slowly so that its keys, like the windows', outlive the run.
  const sluice::rule rules[] = {
      {.name = "tb", .limit = sluice::token_bucket_policy(sluice::per_second(100.0 / 3600), 100)},
      {.name = "swl", .limit = sluice::sliding_window_policy(100, 60s)},
      {.name = "swc", .limit = sluice::sliding_window_counter_policy(100, 60s)},
      {.name = "fw", .limit = sluice::fixed_window_policy(100, 60s)},
      {.name = "dual",
       .limit = sluice::sliding_window_policy(100, 60s),
       .tenant = sluice::sliding_window_policy(1'000'000, 60s)},
  };
  std::printf("%-24s %12s %10s %10s %12s %18s %12s %14s %12s %9s\n", "script", "checks/s", "p50 us", "p99 us",
              "client cpu us", "usec_per_call", "checks/call", "server cpu us", "bytes/key", "failed");
  for (std::size_t n = 0; n < std::size(rules); ++n) {
    if (!o.only.empty() && o.only != labels[n]) continue;
    // Prepared once, as a rule set, sluiced and the middleware do.
    auto prepared = (*backend)->prepare(rules[n]);
    if (!prepared) {
      std::fprintf(stderr, "%s\n", prepared.error().message.c_str());
      return 1;
    }
    const sluice::prepared_rule& r = **prepared;
    long long before = 0, after = 0;
    for (redisContext* c : admins) simple(c, "FLUSHALL");
    for (redisContext* c : admins) before += used_memory(c);
    drive(**backend, r, keys, tenants, static_cast<long>(keys.size()), o.inflight);  // one check per key
    for (redisContext* c : admins) after += used_memory(c);
    for (redisContext* c : admins) simple(c, "CONFIG RESETSTAT");
    const std::uint64_t calls_before = (*backend)->stats().calls;
    double server_cpu = 0;
    for (redisContext* c : admins) server_cpu -= server_cpu_seconds(c);
    run_result res = drive(**backend, r, keys, tenants, o.checks, o.inflight);
    for (redisContext* c : admins) server_cpu += server_cpu_seconds(c);
    const double per_call =
        static_cast<double>(o.checks) / static_cast<double>((*backend)->stats().calls - calls_before);
    std::string usec;
    for (redisContext* c : admins) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%s%.2f", usec.empty() ? "" : "/", evalsha_usec_per_call(c));
      usec += buf;
    }
    std::printf("%-24s %12.0f %10.0f %10.0f %12.2f %18s %12.1f %14.2f %12.0f %9ld\n", labels[n].data(), res.per_second,
                res.p50_us, res.p99_us, res.cpu_us, usec.c_str(), per_call,
                server_cpu * 1e6 / static_cast<double>(o.checks),
                static_cast<double>(after - before) / static_cast<double>(keys.size()), res.failed);
    std::fflush(stdout);
  }
  for (redisContext* c : admins) redisFree(c);
  return 0;
}
