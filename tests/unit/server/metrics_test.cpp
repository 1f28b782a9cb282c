// SPDX-License-Identifier: Apache-2.0
#include "server/metrics.hpp"
#include "sluice/http/middleware.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

namespace sluice::server {
namespace {

using namespace std::chrono_literals;

bool has_line(const std::string& text, const std::string& line) {
  return text.find("\n" + line + "\n") != std::string::npos || text.rfind(line + "\n", 0) == 0;
}

TEST(Metrics, CountsChecksRejectionsAndLatency) {
  metrics m({.max_tenant_labels = 100});
  decision ok{.allowed = true, .limit = 5, .remaining = 4};
  decision no{.allowed = false, .limit = 5, .remaining = 0, .retry_after = 1s};
  m.record_decision("api", "", ok, 40us);
  m.record_decision("api", "", ok, 2ms);
  m.record_decision("api", "", no, 40us);
  std::string t = m.render({.backend_ready = true});
  EXPECT_TRUE(has_line(t, R"(sluice_checks_total{rule="api",result="allowed"} 2)")) << t;
  EXPECT_TRUE(has_line(t, R"(sluice_checks_total{rule="api",result="rejected"} 1)"));
  EXPECT_TRUE(has_line(t, R"(sluice_rejections_total{rule="api",layer="single",tenant=""} 1)"));
  EXPECT_TRUE(has_line(t, R"(sluice_check_duration_seconds_bucket{rule="api",le="5e-05"} 2)"));
  EXPECT_TRUE(has_line(t, R"(sluice_check_duration_seconds_bucket{rule="api",le="0.0025"} 3)"));
  EXPECT_TRUE(has_line(t, R"(sluice_check_duration_seconds_bucket{rule="api",le="+Inf"} 3)"));
  EXPECT_TRUE(has_line(t, R"(sluice_check_duration_seconds_count{rule="api"} 3)"));
  EXPECT_TRUE(has_line(t, "sluice_backend_ready 1"));
  EXPECT_TRUE(has_line(t, "# TYPE sluice_check_duration_seconds histogram"));
}

// The buckets start below the fastest check: a check of a few µs lands in a bucket of its own size,
// not all in the first.
TEST(Metrics, LatencyBucketsStartBelowAnInProcessCheck) {
  metrics m({});
  m.record_decision("fast", "", decision{.allowed = true, .limit = 5, .remaining = 4}, 3us);
  const std::string t = m.render({});
  EXPECT_TRUE(has_line(t, R"(sluice_check_duration_seconds_bucket{rule="fast",le="1e-06"} 0)")) << t;
  EXPECT_TRUE(has_line(t, R"(sluice_check_duration_seconds_bucket{rule="fast",le="2.5e-06"} 0)"));
  EXPECT_TRUE(has_line(t, R"(sluice_check_duration_seconds_bucket{rule="fast",le="5e-06"} 1)"));
  EXPECT_TRUE(has_line(t, R"(sluice_check_duration_seconds_bucket{rule="fast",le="1"} 1)"));
}

// A rule in force appears before its first check, at 0, so that dashboards see an idle rule.
TEST(Metrics, RulesInForceAppearAtZero) {
  metrics m({});
  const std::string t = m.render({.rules = {"idle"}});
  for (const char* result : {"allowed", "rejected", "error"}) {
    EXPECT_TRUE(has_line(t, std::string(R"(sluice_checks_total{rule="idle",result=")") + result + "\"} 0")) << t;
  }
  EXPECT_TRUE(has_line(t, R"(sluice_check_duration_seconds_count{rule="idle"} 0)"));
  EXPECT_TRUE(has_line(t, R"(sluice_check_duration_seconds_bucket{rule="idle",le="+Inf"} 0)"));
}

TEST(Metrics, TenantLabelsAreCappedAndEscaped) {
  metrics m({.max_tenant_labels = 2});
  decision no{.allowed = false, .limit = 1, .dual_layer = true, .rejected_by = layer::tenant};
  m.record_decision("t", "a\"b\n", no, 1us);
  m.record_decision("t", "second", no, 1us);
  m.record_decision("t", "third", no, 1us);
  m.record_decision("t", "fourth", no, 1us);
  m.record_decision("t", "second", no, 1us);
  std::string t = m.render({});
  EXPECT_TRUE(has_line(t, R"(sluice_rejections_total{rule="t",layer="tenant",tenant="a\"b\n"} 1)")) << t;
  EXPECT_TRUE(has_line(t, R"(sluice_rejections_total{rule="t",layer="tenant",tenant="second"} 2)"));
  EXPECT_TRUE(has_line(t, R"(sluice_rejections_total{rule="t",layer="tenant",tenant="other"} 2)"));
  EXPECT_EQ(t.find("third"), std::string::npos);
}

TEST(Metrics, MiddlewareCountersInTheSameFormat) {
  std::vector<http::rule_counters> counters{
      {.rule = "api", .admitted = 7, .refused = 2, .backend_errors = 1, .invalid = 1},
      {.rule = "we\"ird", .admitted = 0}};
  std::string text = http::render_prometheus(counters);
  EXPECT_NE(text.find("# TYPE sluice_middleware_requests_total counter\n"), std::string::npos);
  EXPECT_NE(text.find("sluice_middleware_requests_total{rule=\"api\",result=\"allowed\"} 7\n"), std::string::npos);
  EXPECT_NE(text.find("sluice_middleware_requests_total{rule=\"api\",result=\"rejected\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("sluice_middleware_requests_total{rule=\"api\",result=\"error\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("sluice_middleware_requests_total{rule=\"api\",result=\"invalid\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("{rule=\"we\\\"ird\",result=\"allowed\"} 0\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("shadow_rejected"), std::string::npos) << "enforcing: no shadow refusals";
  // In shadow mode, what the limiter refused went on: shadow_rejected, as sluiced's shadow rules.
  const std::string shadow =
      http::render_prometheus({{.rule = "s", .admitted = 10, .refused = 3, .shadow = true}});
  EXPECT_NE(shadow.find("{rule=\"s\",result=\"allowed\"} 7\n"), std::string::npos) << shadow;
  EXPECT_NE(shadow.find("{rule=\"s\",result=\"rejected\"} 0\n"), std::string::npos) << shadow;
  EXPECT_NE(shadow.find("{rule=\"s\",result=\"shadow_rejected\"} 3\n"), std::string::npos) << shadow;
}

TEST(Metrics, FailurePolicyErrorsReloadsResponses) {
  metrics m({});
  m.record_decision("api", "", decision{.allowed = true, .source = decision_source::fail_open}, 1ms);
  m.record_backend_error("api", error(errc::backend_timeout, "slow"), 50ms);
  m.record_reload(true);
  m.record_reload(false);
  m.record_reload(false);
  m.record_response(429);
  std::string t = m.render({.backend_ready = false});
  EXPECT_TRUE(has_line(t, R"(sluice_failure_policy_decisions_total{rule="api",source="fail_open"} 1)")) << t;
  EXPECT_TRUE(has_line(t, "sluice_fail_open_total 1"));
  EXPECT_TRUE(has_line(t, R"(sluice_checks_total{rule="api",result="error"} 1)"));
  EXPECT_NE(t.find("sluice_backend_errors_total{rule=\"api\",error="), std::string::npos);
  EXPECT_TRUE(has_line(t, R"(sluice_config_reloads_total{result="success"} 1)"));
  EXPECT_TRUE(has_line(t, R"(sluice_config_reloads_total{result="failure"} 2)"));
  EXPECT_TRUE(has_line(t, R"(sluice_http_responses_total{code="429"} 1)"));
  EXPECT_TRUE(has_line(t, "sluice_backend_ready 0"));
  EXPECT_EQ(t.find("sluice_live_keys"), std::string::npos);
}

}  // namespace
}  // namespace sluice::server

#include <thread>
#include <vector>

namespace sluice::server {
namespace {

// Counters live in per-thread shards; the exposition must still be the exact sum.
TEST(Metrics, ShardsFromManyThreadsSumExactly) {
  metrics m({.max_tenant_labels = 3});
  constexpr int threads = 8;
  constexpr int per_thread = 2000;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&m, t] {
      decision ok{.allowed = true, .limit = 5, .remaining = 4};
      decision no{.allowed = false, .limit = 5, .dual_layer = true, .rejected_by = layer::tenant};
      for (int i = 0; i < per_thread; ++i) {
        m.record_decision("api", "", ok, std::chrono::microseconds(10));
        m.record_decision("t", "tenant" + std::to_string((t + i) % 5), no, std::chrono::microseconds(10));
        m.record_response(200);
      }
    });
  }
  // Render while recording: must be safe and internally consistent.
  for (int i = 0; i < 20; ++i) EXPECT_NE(m.render({}).find("sluice_checks_total"), std::string::npos);
  for (auto& th : pool) th.join();
  std::string t = m.render({});
  EXPECT_TRUE(
      has_line(t, "sluice_checks_total{rule=\"api\",result=\"allowed\"} " + std::to_string(threads * per_thread)))
      << t;
  EXPECT_TRUE(has_line(t, "sluice_check_duration_seconds_count{rule=\"t\"} " + std::to_string(threads * per_thread)));
  EXPECT_TRUE(has_line(t, "sluice_http_responses_total{code=\"200\"} " + std::to_string(threads * per_thread)));
  // Three tenants got labels, the other two count as "other"; the sum is every refusal.
  std::uint64_t sum = 0;
  int series = 0;
  for (std::size_t at = t.find("sluice_rejections_total{"); at != std::string::npos;
       at = t.find("sluice_rejections_total{", at + 1)) {
    auto eol = t.find('\n', at);
    sum += std::stoull(t.substr(t.rfind(' ', eol) + 1, eol - t.rfind(' ', eol) - 1));
    ++series;
  }
  EXPECT_EQ(sum, static_cast<std::uint64_t>(threads * per_thread));
  EXPECT_EQ(series, 4);
}

}  // namespace
}  // namespace sluice::server
