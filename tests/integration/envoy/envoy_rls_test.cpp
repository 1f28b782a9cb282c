// SPDX-License-Identifier: Apache-2.0
// sluiced's Envoy API over real gRPC: a client built from the project's .proto talks to a running
// sluiced on each backend (memory, a real redis-server, a real Redis Cluster), and to its config
// errors, reloads and hostile requests.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>

#include "integration/envoy/sluiced_process.hpp"
#include "integration/redis/redis_cluster.hpp"
#include "integration/redis/redis_server.hpp"
#include "unit/envoy/requests.hpp"

namespace sluice {
namespace {

namespace rls = ::envoy::service::ratelimit::v3;
using testing::rls_request;
using testing::sluiced_process;

constexpr const char* edge_yaml = R"(domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: day, requests_per_unit: 3}
  - key: path
    value: "/login*"
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: tenant
    descriptors:
      - key: plan
        value: free
        rate_limit: {unit: day, requests_per_unit: 2}
  - key: shadowed
    shadow_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: vip
    rate_limit: {unlimited: true}
)";

struct answer {
  grpc::Status status;
  rls::RateLimitResponse response;
};

answer ask(rls::RateLimitService::Stub& stub, const rls::RateLimitRequest& req) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  answer a;
  a.status = stub.ShouldRateLimit(&ctx, req, &a.response);
  return a;
}

rls::RateLimitResponse ok_answer(rls::RateLimitService::Stub& stub, const rls::RateLimitRequest& req) {
  answer a = ask(stub, req);
  EXPECT_TRUE(a.status.ok()) << a.status.error_message();
  EXPECT_EQ(a.response.statuses_size(), req.descriptors_size());
  return a.response;
}

enum class kind { memory, redis, redis_cluster };

class EnvoyApi : public ::testing::TestWithParam<kind> {
 protected:
  static void TearDownTestSuite() {
    delete redis_;
    delete cluster_;
    redis_ = nullptr;
    cluster_ = nullptr;
  }

  // Sanitizer builds on a loaded machine can take longer than the default 50 ms for a first script
  // call (a failed-open answer would then be counted as a decision); the timeout path has its own tests.
  static constexpr const char* slow_build_timeout = "timeout_ms = 2000\n";

  // [backend] for this test's backend, starting its server the first time.
  std::string backend_toml() const {
    switch (GetParam()) {
      case kind::memory: return "[backend]\ntype = \"memory\"\n";
      case kind::redis:
        if (!redis_) redis_ = new testing::redis_server();
        redis_->command({"FLUSHALL"});
        return "[backend]\ntype = \"redis\"\naddresses = [\"" + redis_->address() + "\"]\n" + slow_build_timeout;
      case kind::redis_cluster: {
        if (!cluster_) cluster_ = new testing::redis_cluster();
        for (auto* m : cluster_->masters()) m->command({"FLUSHALL"});
        std::string seeds;
        for (const auto& s : cluster_->seeds()) seeds += (seeds.empty() ? "\"" : ", \"") + s + "\"";
        return "[backend]\ntype = \"redis_cluster\"\naddresses = [" + seeds + "]\n" + slow_build_timeout;
      }
    }
    return {};
  }

  static testing::redis_server* redis_;
  static testing::redis_cluster* cluster_;
};

testing::redis_server* EnvoyApi::redis_ = nullptr;
testing::redis_cluster* EnvoyApi::cluster_ = nullptr;

TEST_P(EnvoyApi, CountsMatchesAndRefusesAllOrNothing) {
  sluiced_process s("[server]\n[envoy]\n" + backend_toml(), {{"edge.yaml", edge_yaml}});
  auto stub = s.stub();
  // Key alone: each address its own counter, in a day aligned to the epoch.
  const auto a = rls_request({{{"remote_address", "10.0.0.1"}}});
  for (std::uint32_t left : {2u, 1u, 0u}) {
    auto r = ok_answer(*stub, a);
    EXPECT_EQ(r.overall_code(), rls::RateLimitResponse::OK);
    EXPECT_EQ(r.statuses(0).limit_remaining(), left);
    EXPECT_EQ(r.statuses(0).current_limit().requests_per_unit(), 3u);
    EXPECT_EQ(r.statuses(0).current_limit().unit(), rls::RateLimitResponse::RateLimit::DAY);
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    const auto to_midnight = 86'400 - std::chrono::duration_cast<std::chrono::seconds>(now).count() % 86'400;
    EXPECT_NEAR(static_cast<double>(r.statuses(0).duration_until_reset().seconds()), static_cast<double>(to_midnight),
                5)
        << "the day ends at midnight UTC";
  }
  auto over = ok_answer(*stub, a);
  EXPECT_EQ(over.overall_code(), rls::RateLimitResponse::OVER_LIMIT);
  EXPECT_EQ(over.statuses(0).code(), rls::RateLimitResponse::OVER_LIMIT);

  // With a refusing descriptor, the other takes nothing (on a cluster too, where the two counters
  // live in different slots).
  auto both = ok_answer(*stub, rls_request({{{"remote_address", "10.0.0.1"}}, {{"remote_address", "10.0.0.2"}}}));
  EXPECT_EQ(both.overall_code(), rls::RateLimitResponse::OVER_LIMIT);
  EXPECT_EQ(both.statuses(1).code(), rls::RateLimitResponse::OK);
  EXPECT_EQ(both.statuses(1).limit_remaining(), 3u);
  EXPECT_EQ(ok_answer(*stub, rls_request({{{"remote_address", "10.0.0.2"}}})).statuses(0).limit_remaining(), 2u);

  // Wildcard, nested, no match, shadow_mode, unlimited, hits_addend.
  EXPECT_EQ(ok_answer(*stub, rls_request({{{"path", "/login/x"}}})).statuses(0).limit_remaining(), 0u);
  EXPECT_EQ(ok_answer(*stub, rls_request({{{"path", "/login/x"}}})).overall_code(), rls::RateLimitResponse::OVER_LIMIT);
  EXPECT_EQ(ok_answer(*stub, rls_request({{{"tenant", "t"}, {"plan", "free"}}}, 2)).statuses(0).limit_remaining(), 0u);
  EXPECT_FALSE(ok_answer(*stub, rls_request({{{"tenant", "t"}}})).statuses(0).has_current_limit());
  EXPECT_FALSE(ok_answer(*stub, rls_request({{{"unknown", "x"}}})).statuses(0).has_current_limit());
  ok_answer(*stub, rls_request({{{"shadowed", "x"}}}));
  auto shadow = ok_answer(*stub, rls_request({{{"shadowed", "x"}}}));
  EXPECT_EQ(shadow.overall_code(), rls::RateLimitResponse::OK);
  EXPECT_EQ(shadow.statuses(0).limit_remaining(), 0u);
  EXPECT_EQ(ok_answer(*stub, rls_request({{{"vip", "x"}}}, 100)).statuses(0).limit_remaining(), 4294967295u);

  const std::string metrics = s.http_get("/metrics");
  EXPECT_NE(metrics.find("sluice_envoy_over_limit_total{domain=\"edge\",descriptor=\"remote_address\"} 2"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("sluice_envoy_shadow_mode_total{domain=\"edge\",descriptor=\"shadowed\"} 1"),
            std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(EveryBackend, EnvoyApi, ::testing::Values(kind::memory, kind::redis, kind::redis_cluster),
                         [](const auto& info) {
                           switch (info.param) {
                             case kind::memory: return std::string("memory");
                             case kind::redis: return std::string("redis");
                             case kind::redis_cluster: return std::string("redis_cluster");
                           }
                           return std::string("unknown");
                         });

TEST(EnvoyApiConfig, AnInvalidFileAtStartIsAnErrorNamingItsLine) {
  sluiced_process s("[server]\n[envoy]\n",
                    {{"edge.yaml", "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight}\n"}},
                    false);
  EXPECT_EQ(s.wait_exit(), 1);
  EXPECT_NE(s.log().find("edge.yaml:4: unit must be"), std::string::npos) << s.log();
}

TEST(EnvoyApiConfig, TheDirectoryIsReloadedAndABadFileKeepsTheRunningLimits) {
  sluiced_process s("[server]\nwatch_interval_ms = 50\n[envoy]\n", {{"edge.yaml", edge_yaml}});
  auto stub = s.stub();
  const auto a = rls_request({{{"remote_address", "10.0.0.1"}}});
  EXPECT_EQ(ok_answer(*stub, a).statuses(0).limit_remaining(), 2u);
  std::string raised = edge_yaml;
  raised.replace(raised.find("requests_per_unit: 3"), 20, "requests_per_unit: 9");
  s.write_yaml("edge.yaml", raised);
  s.wait_for_log("event=envoy_config result=success", 2);
  EXPECT_EQ(ok_answer(*stub, a).statuses(0).limit_remaining(), 7u) << "the count kept, under the raised limit";

  s.write_yaml("edge.yaml", "domain: edge\ndescriptors: [\n");
  s.wait_for_log("event=envoy_config result=failure");
  EXPECT_NE(s.log().find("edge.yaml:"), std::string::npos);
  EXPECT_EQ(ok_answer(*stub, a).statuses(0).limit_remaining(), 6u) << "the running limits are kept";
  EXPECT_NE(s.http_get("/metrics").find("sluice_envoy_config_errors_total 1"), std::string::npos);

  s.write_yaml("other.yaml",
               "domain: other\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1}\n");
  s.write_yaml("edge.yaml", raised);
  s.wait_for_log("event=envoy_config result=success", 2 + 1);
  EXPECT_EQ(ok_answer(*stub, rls_request({{{"k", "v"}}}, 0, "other")).statuses(0).limit_remaining(), 0u);
}

TEST(EnvoyApiHostile, MalformedRequestsGetInvalidArgumentAndTheServiceLives) {
  sluiced_process s("[server]\n[envoy]\n", {{"edge.yaml", edge_yaml}});
  auto stub = s.stub();
  auto huge = rls_request({{{"remote_address", "x"}}});
  huge.mutable_descriptors(0)->mutable_hits_addend()->set_value(std::uint64_t{1} << 50);
  for (const auto& bad : {rls_request({{{"remote_address", "x"}}}, 0, ""), rls::RateLimitRequest(), huge}) {
    answer a = ask(*stub, bad);
    EXPECT_EQ(a.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << a.status.error_message();
  }
  // Bytes that are not HTTP/2, and a request over the size limit: refused, and nothing else happens.
  {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(s.grpc_port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    const std::string garbage(4096, '\xff');
    (void)::write(fd, garbage.data(), garbage.size());
    ::close(fd);
  }
  auto big = rls_request({{{"remote_address", "x"}}});
  big.mutable_descriptors(0)->mutable_entries(0)->set_value(std::string(200'000, 'v'));
  EXPECT_EQ(ask(*stub, big).status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(ok_answer(*stub, rls_request({{{"remote_address", "x"}}})).statuses(0).limit_remaining(), 2u)
      << "nothing was counted";
  EXPECT_TRUE(s.running());
  EXPECT_NE(s.http_get("/metrics").find("sluice_envoy_requests_total{code=\"invalid\"} 3"), std::string::npos);
}

}  // namespace
}  // namespace sluice
