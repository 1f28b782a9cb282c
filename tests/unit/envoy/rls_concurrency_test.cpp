// SPDX-License-Identifier: Apache-2.0
// ShouldRateLimit from many threads at once, while the rules are reloaded: every counter admits
// exactly its limit, and a refused request takes nothing from the other descriptor (run under TSan).
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "envoy/rls_service.hpp"
#include "sluice/memory_backend.hpp"
#include "sluice/testing/simulated_clock.hpp"
#include "unit/envoy/requests.hpp"

namespace sluice::envoy {
namespace {

constexpr const char* yaml = R"(domain: edge
descriptors:
  - key: scarce
    rate_limit: {unit: day, requests_per_unit: 100}
  - key: plenty
    rate_limit: {unit: day, requests_per_unit: 1000000}
)";

TEST(EnvoyServiceConcurrency, ManyThreadsAdmitExactlyTheLimitWhileRulesReload) {
  testing::simulated_clock clock;
  auto backend = make_memory_backend({.clock = &clock}).value();
  rls_service service(*backend, {});
  auto build = [&] {
    std::vector<domain_config> domains;
    domains.push_back(parse_domain(yaml, "edge.yaml").value());
    return rls_rules::build(std::move(domains), *backend, service.rules().get(), service.counters()).value();
  };
  service.set_rules(build());

  constexpr int threads = 4;
  constexpr int per_thread = 500;
  std::atomic<int> admitted{0};
  std::atomic<bool> done{false};
  std::thread reloader([&] {
    while (!done.load()) service.set_rules(build());  // the same limits: their counts carry over
  });
  std::vector<std::thread> callers;
  for (int t = 0; t < threads; ++t) {
    callers.emplace_back([&, t] {
      const std::string caller = "c" + std::to_string(t);
      for (int i = 0; i < per_thread; ++i) {
        auto req = testing::rls_request({{{"scarce", "x"}}, {{"plenty", caller.c_str()}}});
        pb::RateLimitResponse resp;
        grpc::Status status;
        service.decide(req, resp, [&](grpc::Status s) { status = std::move(s); });
        ASSERT_TRUE(status.ok()) << status.error_message();
        if (resp.overall_code() == pb::RateLimitResponse::OK) admitted.fetch_add(1);
      }
    });
  }
  for (auto& c : callers) c.join();
  done = true;
  reloader.join();
  EXPECT_EQ(admitted.load(), 100);
  // Each caller's own counter took only its admitted requests.
  int taken = 0;
  for (int t = 0; t < threads; ++t) {
    const std::string caller = "c" + std::to_string(t);
    auto req = testing::rls_request({{{"plenty", caller.c_str()}}});
    pb::RateLimitResponse resp;
    service.decide(req, resp, [](grpc::Status) {});
    taken += 1'000'000 - 1 - static_cast<int>(resp.statuses(0).limit_remaining());
  }
  EXPECT_EQ(taken, 100);
}

}  // namespace
}  // namespace sluice::envoy
