// SPDX-License-Identifier: Apache-2.0
// The gRPC server over real sockets: clients on their own channels at once get exactly the limit,
// and a shutdown while a call is still deciding (on Redis, its reply outstanding) neither hangs
// nor answers into a freed call.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "envoy/rls_server.hpp"
#include "envoy/rls_service.hpp"
#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"
#include "sluice/memory_backend.hpp"
#include "sluice/testing/simulated_clock.hpp"
#include "unit/envoy/requests.hpp"

namespace sluice::envoy {
namespace {

constexpr const char* yaml = R"(domain: edge
descriptors:
  - key: scarce
    rate_limit: {unit: day, requests_per_unit: 50}
)";

std::shared_ptr<const rls_rules> rules_for(backend& b, rls_service& service) {
  std::vector<domain_config> domains;
  domains.push_back(parse_domain(yaml, "edge.yaml").value());
  return rls_rules::build(std::move(domains), b, nullptr, service.counters()).value();
}

std::unique_ptr<pb::RateLimitService::Stub> connect(int port) {
  return pb::RateLimitService::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
}

grpc::Status ask(pb::RateLimitService::Stub& stub, const pb::RateLimitRequest& req, pb::RateLimitResponse& resp) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  return stub.ShouldRateLimit(&ctx, req, &resp);
}

TEST(EnvoyServer, ClientsOnManyChannelsAdmitExactlyTheLimit) {
  testing::simulated_clock clock;
  auto backend = make_memory_backend({.clock = &clock}).value();
  rls_service service(*backend, {});
  service.set_rules(rules_for(*backend, service));
  auto server = rls_server::start("127.0.0.1:0", service);
  ASSERT_TRUE(server.ok()) << server.error().message;
  ASSERT_GT((*server)->port(), 0);

  constexpr int clients = 4;
  constexpr int per_client = 40;
  std::atomic<int> admitted{0}, refused{0}, failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < clients; ++t) {
    threads.emplace_back([&] {
      auto stub = connect((*server)->port());
      for (int i = 0; i < per_client; ++i) {
        pb::RateLimitResponse resp;
        grpc::Status s = ask(*stub, testing::rls_request({{{"scarce", "x"}}}), resp);
        if (!s.ok())
          failed.fetch_add(1);
        else if (resp.overall_code() == pb::RateLimitResponse::OK)
          admitted.fetch_add(1);
        else if (resp.overall_code() == pb::RateLimitResponse::OVER_LIMIT)
          refused.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(admitted.load(), 50);
  EXPECT_EQ(refused.load(), clients * per_client - 50);

  // A malformed request gets INVALID_ARGUMENT over the wire, and the server keeps serving.
  auto stub = connect((*server)->port());
  pb::RateLimitResponse resp;
  EXPECT_EQ(ask(*stub, testing::rls_request({}), resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(ask(*stub, testing::rls_request({{{"other", "y"}}}), resp).ok());
  (*server)->shutdown(std::chrono::seconds(5));
}

// Forwards to a memory backend, but keeps the first async_check_all's handler until the test
// fires it: a call deciding on Redis while the server shuts down. Its prepared rules wrap the
// memory backend's (a backend checks only rules it prepared).
class held_backend : public backend {
 public:
  explicit held_backend(backend& inner) : inner_(inner) {}

  result<prepared_rule_ptr> prepare(const rule& r) override { return wrap(inner_.prepare(r)); }
  result<prepared_rule_ptr> prepare_change(const rule& r, const prepared_rule& previous) override {
    return wrap(inner_.prepare_change(r, *inner_of(previous)));
  }
  result<prepared_rule_ptr> prepare_override(const rule& r, const prepared_rule& base) override {
    return wrap(inner_.prepare_override(r, *inner_of(base)));
  }
  result<decision> decide(const check_request& req) override { return inner_.check(unwrapped(req)); }
  void async_decide(const check_request& req, check_handler h) override {
    inner_.async_check(unwrapped(req), std::move(h));
  }
  result<std::vector<decision>> decide_all(std::span<const check_request> c) override {
    return inner_.check_all(unwrapped(c));
  }
  void async_decide_all(std::span<const check_request> c, check_all_handler h) override {
    std::lock_guard lock(mutex_);
    held_checks_ = unwrapped(c);
    held_ = std::move(h);
    arrived_.set_value();
  }
  bool ready() override { return true; }

  std::future<void> arrived() { return arrived_.get_future(); }
  void fire() {
    std::lock_guard lock(mutex_);
    held_(inner_.check_all(held_checks_));
    held_ = nullptr;
  }

 private:
  struct wrapped final : prepared_rule {
    wrapped(prepared_rule_ptr p, const backend* owner) : prepared_rule(p->definition(), owner), inner(std::move(p)) {}
    prepared_rule_ptr inner;
  };
  result<prepared_rule_ptr> wrap(result<prepared_rule_ptr> p) {
    if (!p) return p;
    return prepared_rule_ptr(std::make_shared<wrapped>(std::move(*p), this));
  }
  static const prepared_rule* inner_of(const prepared_rule& p) { return static_cast<const wrapped&>(p).inner.get(); }
  static check_request unwrapped(check_request req) {
    req.rule = inner_of(*req.rule);
    return req;
  }
  static std::vector<check_request> unwrapped(std::span<const check_request> c) {
    std::vector<check_request> out;
    for (const check_request& req : c) out.push_back(unwrapped(req));
    return out;
  }

  backend& inner_;
  std::mutex mutex_;
  std::promise<void> arrived_;
  std::vector<check_request> held_checks_;
  check_all_handler held_;
};

TEST(EnvoyServer, ShutdownWithACallStillDecidingCompletesOnceItAnswers) {
  testing::simulated_clock clock;
  auto memory = make_memory_backend({.clock = &clock}).value();
  held_backend backend(*memory);
  rls_service service(backend, {});
  service.set_rules(rules_for(backend, service));
  auto server = rls_server::start("127.0.0.1:0", service);
  ASSERT_TRUE(server.ok()) << server.error().message;
  auto arrived = backend.arrived();

  grpc::Status client_status;
  std::thread client([&] {
    auto stub = connect((*server)->port());
    pb::RateLimitResponse resp;
    client_status = ask(*stub, testing::rls_request({{{"scarce", "x"}}}), resp);
  });
  ASSERT_EQ(arrived.wait_for(std::chrono::seconds(20)), std::future_status::ready);

  // The grace is over at once: gRPC cancels the call (the client sees UNAVAILABLE, which Envoy
  // answers by its failure_mode_deny), and shutdown waits until the call has answered.
  std::atomic<bool> stopped{false};
  std::thread stopper([&] {
    (*server)->shutdown(std::chrono::milliseconds(0));
    stopped = true;
  });
  client.join();
  EXPECT_EQ(client_status.error_code(), grpc::StatusCode::UNAVAILABLE) << client_status.error_message();
  EXPECT_FALSE(stopped.load());
  backend.fire();  // the late reply answers a cancelled call (ASan would catch a freed one)
  stopper.join();
}

}  // namespace
}  // namespace sluice::envoy
