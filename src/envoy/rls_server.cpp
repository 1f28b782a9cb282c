// SPDX-License-Identifier: Apache-2.0
#include "envoy/rls_server.hpp"

#include <memory>

#include "envoy/grpc_server.hpp"
#include "sluice/prometheus.hpp"

namespace sluice::envoy {

namespace {

constexpr const char* should_rate_limit = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
constexpr const char* health_check = "/grpc.health.v1.Health/Check";

// One ShouldRateLimit while it is decided: what the backend reads and writes until it answers.
struct rls_call {
  pb::RateLimitRequest request;
  pb::RateLimitResponse response;
  grpc_responder responder;
};

// grpc.health.v1.HealthCheckRequest is { string service = 1; }: "" (the server) or the rate-limit
// service is SERVING; any other name is NOT_FOUND, as gRPC's own health service answers.
bool names_served_service(std::string_view request) {
  if (request.empty()) return true;
  const std::string_view ours = "envoy.service.ratelimit.v3.RateLimitService";
  if (request.size() < 2 || request[0] != 0x0a) return false;  // field 1, length-delimited
  const auto n = static_cast<unsigned char>(request[1]);
  if (n >= 0x80) return false;  // longer than any name served
  const std::string_view name = request.substr(2);
  return name.size() == n && (name.empty() || name == ours);
}

}  // namespace

rls_server::rls_server(std::unique_ptr<grpc_server> s) : server_(std::move(s)) {}

rls_server::~rls_server() = default;

int rls_server::port() const noexcept { return server_->port(); }

result<std::unique_ptr<rls_server>> rls_server::start(const std::string& address, rls_service& service,
                                                      const grpc_limits& limits) {
  grpc_server::methods methods;
  methods[should_rate_limit] = [&service](std::string_view request, grpc_responder responder) {
    auto c = std::make_shared<rls_call>();
    if (!c->request.ParseFromArray(request.data(), static_cast<int>(request.size()))) {
      return responder.finish(grpc_code::invalid_argument, "the request is not a RateLimitRequest");
    }
    c->responder = std::move(responder);
    rls_call& call = *c;
    service.decide(call.request, call.response, [c = std::move(c)](grpc::Status s) {
      if (!s.ok()) return c->responder.finish(static_cast<grpc_code>(s.error_code()), s.error_message());
      c->responder.finish(grpc_code::ok, "", c->response.SerializeAsString());
    });
  };
  methods[health_check] = [](std::string_view request, grpc_responder responder) {
    if (!names_served_service(request)) return responder.finish(grpc_code::not_found, "unknown service");
    static constexpr char serving[] = {0x08, 0x01};  // HealthCheckResponse{status: SERVING}
    responder.finish(grpc_code::ok, "", std::string_view(serving, sizeof serving));
  };
  auto server = grpc_server::start(address, std::move(methods), limits);
  if (!server) return server.error();
  return std::unique_ptr<rls_server>(new rls_server(std::move(*server)));
}

void rls_server::shutdown(std::chrono::milliseconds grace) { server_->shutdown(grace); }

void rls_server::append_metrics(std::string& out) const {
  const grpc_server::stats& s = server_->counters();
  prometheus::family(out, "sluice_grpc_connections", "gauge", "gRPC connections open.");
  prometheus::sample(out, "sluice_grpc_connections", s.open.load(std::memory_order_relaxed));
  prometheus::family(out, "sluice_grpc_connections_accepted_total", "counter", "gRPC connections accepted.");
  prometheus::sample(out, "sluice_grpc_connections_accepted_total", s.accepted.load(std::memory_order_relaxed));
  prometheus::family(out, "sluice_grpc_connections_closed_total", "counter",
                     "gRPC connections the server closed, by reason (peers' own closes are not counted).");
  for (int r = 0; r < static_cast<int>(close_reason::count_); ++r) {
    const std::string name = std::string("sluice_grpc_connections_closed_total{reason=\"") +
                             std::string(close_reason_name(static_cast<close_reason>(r))) + "\"}";
    prometheus::sample(out, name, s.closed[r].load(std::memory_order_relaxed));
  }
}

}  // namespace sluice::envoy
