// SPDX-License-Identifier: Apache-2.0
// The middleware's own cost per request, without HTTP: route lookup, key derivation (client IP
// from X-Forwarded-For behind a trusted proxy), the memory backend's check and the header fields.
// bench/http/run.sh measures the same path end to end over HTTP with wrk.
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "sluice/http/middleware.hpp"
#include "sluice/memory_backend.hpp"

namespace {

using namespace sluice;
using namespace sluice::http;

std::shared_ptr<middleware> make() {
  auto m = middleware::create({
      .backend = make_memory_backend({}).value(),
      .rules = {{.name = "notes", .limit = token_bucket_policy(per_second(5), 60), .tenant = std::nullopt},
                {.name = "public", .limit = token_bucket_policy(per_second(5), 60), .tenant = std::nullopt}},
      .routes = {{.path = "/notes/*", .rule = "notes", .key = key_by::user},
                 {.method = "GET", .path = "/public", .rule = "public", .key = key_by::client_ip}},
      .exempt = {{.path = "/healthz"}},
      .trusted_proxies = {"127.0.0.1/32"},
  });
  return *m;
}

std::vector<std::string> addresses(int n) {
  std::vector<std::string> v;
  for (int i = 0; i < n; ++i) v.push_back("10." + std::to_string(i / 250 % 250) + "." + std::to_string(i % 250) + ".7");
  return v;
}

void BM_Middleware_Find(benchmark::State& state) {
  auto m = make();
  for (auto _ : state) benchmark::DoNotOptimize(m->find("GET", "/public?x=1"));
}
BENCHMARK(BM_Middleware_Find);

void BM_Middleware_ClientAddressXff(benchmark::State& state) {
  std::vector<cidr> trusted{*parse_cidr("127.0.0.1/32")};
  ip_address peer = *parse_ip("127.0.0.1");
  for (auto _ : state) {
    benchmark::DoNotOptimize(client_address({.peer_ip = peer, .x_forwarded_for = "203.0.113.9, 10.1.2.7"}, trusted));
  }
}
BENCHMARK(BM_Middleware_ClientAddressXff);

// The whole admitted path for an anonymous request keyed by client IP, 20,000 clients.
void BM_Middleware_AdmitPerIp(benchmark::State& state) {
  auto m = make();
  auto ips = addresses(20000);
  ip_address peer = *parse_ip("127.0.0.1");
  std::size_t i = 0;
  for (auto _ : state) {
    const route_limit* r = m->find("GET", "/public");
    outcome o = m->check(m->prepare(*r, {.peer_ip = peer, .x_forwarded_for = ips[i++ % ips.size()]}, nullptr));
    benchmark::DoNotOptimize(o);
  }
}
BENCHMARK(BM_Middleware_AdmitPerIp);

// The whole admitted path for a logged-in user, 20,000 users.
void BM_Middleware_AdmitPerUser(benchmark::State& state) {
  auto m = make();
  std::vector<identity> users;
  for (int u = 0; u < 20000; ++u) users.push_back({.user = "user-" + std::to_string(u)});
  std::size_t i = 0;
  for (auto _ : state) {
    const route_limit* r = m->find("GET", "/notes/42");
    outcome o = m->check(m->prepare(*r, {.peer = "127.0.0.1"}, &users[i++ % users.size()]));
    benchmark::DoNotOptimize(o);
  }
}
BENCHMARK(BM_Middleware_AdmitPerUser);

}  // namespace
BENCHMARK_MAIN();
