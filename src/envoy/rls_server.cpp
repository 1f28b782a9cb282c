#include "envoy/rls_server.hpp"

#include <absl/synchronization/mutex.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>

#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"

namespace sluice::envoy {
namespace {

class handler final : public pb::RateLimitService::CallbackService {
 public:
  explicit handler(rls_service& s) : service_(s) {}

  grpc::ServerUnaryReactor* ShouldRateLimit(grpc::CallbackServerContext* context, const pb::RateLimitRequest* request,
                                            pb::RateLimitResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    service_.decide(*request, *response, [reactor](grpc::Status s) { reactor->Finish(std::move(s)); });
    return reactor;
  }

 private:
  rls_service& service_;
};

}  // namespace

struct rls_server::impl {
  explicit impl(rls_service& s) : calls(s) {}
  handler calls;
  std::unique_ptr<grpc::Server> server;
  bool stopped = false;
};

rls_server::rls_server(std::unique_ptr<impl> i, int port) : impl_(std::move(i)), port_(port) {}

rls_server::~rls_server() { shutdown(std::chrono::milliseconds(0)); }

result<std::unique_ptr<rls_server>> rls_server::start(const std::string& address, rls_service& service) {
#ifdef NDEBUG
  // Debian's abseil is built without NDEBUG, which leaves deadlock detection on for every
  // absl::Mutex: gRPC locks several per call, and keeping the detection's lock graph cost 14–17%
  // of the calls per second here. It is a debugging aid, kept in our builds with assertions;
  // abseil's release builds have it off.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
  auto i = std::make_unique<impl>(service);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&i->calls);
  builder.SetMaxReceiveMessageSize(max_request_bytes);
  grpc::ResourceQuota quota("sluiced-grpc");
  quota.Resize(max_grpc_memory);
  builder.SetResourceQuota(quota);
  i->server = builder.BuildAndStart();
  if (!i->server || port == 0) return error(errc::config_invalid, "cannot listen for gRPC on " + address);
  return std::unique_ptr<rls_server>(new rls_server(std::move(i), port));
}

void rls_server::shutdown(std::chrono::milliseconds grace) {
  if (impl_->stopped) return;
  impl_->stopped = true;
  impl_->server->Shutdown(std::chrono::system_clock::now() + grace);
  impl_->server->Wait();
}

}  // namespace sluice::envoy
