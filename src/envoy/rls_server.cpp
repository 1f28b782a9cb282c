#include "envoy/rls_server.hpp"

#include <absl/synchronization/mutex.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"

namespace sluice::envoy {

namespace {

// What the calls share: the service deciding them, and how many are alive.
struct serving {
  explicit serving(rls_service& s) : service(s) {}

  rls_service& service;
  pb::RateLimitService::AsyncService calls;
  std::mutex mutex;
  std::condition_variable none_alive;
  int alive = 0;  // calls asked for or answering; guarded by mutex
};

// One ShouldRateLimit on one queue: asked for, then decided, then answered. The queue's thread
// hands it each of its two events; it asks for the next call as soon as this one arrives.
class call {
 public:
  call(serving& server, grpc::ServerCompletionQueue& queue) : server_(server), queue_(queue) {
    {
      std::lock_guard lock(server_.mutex);
      ++server_.alive;
    }
    server_.calls.RequestShouldRateLimit(&context_, &request_, &responder_, &queue_, &queue_, this);
  }

  call(const call&) = delete;
  call& operator=(const call&) = delete;

  // `ok` false: the server is shutting down and this call never came.
  void on_event(bool ok) {
    if (!ok || answered_) {
      delete this;
      return;
    }
    new call(server_, queue_);
    answered_ = true;
    server_.service.decide(request_, response_,
                           [this](grpc::Status s) { responder_.Finish(response_, std::move(s), this); });
  }

 private:
  ~call() {
    std::lock_guard lock(server_.mutex);
    if (--server_.alive == 0) server_.none_alive.notify_all();
  }

  serving& server_;
  grpc::ServerCompletionQueue& queue_;
  grpc::ServerContext context_;
  pb::RateLimitRequest request_;
  pb::RateLimitResponse response_;
  grpc::ServerAsyncResponseWriter<pb::RateLimitResponse> responder_{&context_};
  bool answered_ = false;
};

// Calls each queue keeps asked for, so a burst of new calls finds one waiting.
constexpr int calls_asked_per_queue = 32;

}  // namespace

struct rls_server::impl {
  explicit impl(rls_service& s) : state(s) {}

  serving state;
  std::unique_ptr<grpc::Server> server;
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> queues;
  std::vector<std::thread> threads;  // one per queue
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
  builder.RegisterService(&i->state.calls);
  builder.SetMaxReceiveMessageSize(max_request_bytes);
  grpc::ResourceQuota quota("sluiced-grpc");
  quota.Resize(max_grpc_memory);
  builder.SetResourceQuota(quota);
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  for (unsigned t = 0; t < threads; ++t) i->queues.push_back(builder.AddCompletionQueue());
  i->server = builder.BuildAndStart();
  if (!i->server || port == 0) return error(errc::config_invalid, "cannot listen for gRPC on " + address);
  for (auto& q : i->queues) {
    for (int c = 0; c < calls_asked_per_queue; ++c) new call(i->state, *q);
    i->threads.emplace_back([q = q.get()] {
      void* tag = nullptr;
      bool ok = false;
      while (q->Next(&tag, &ok)) static_cast<call*>(tag)->on_event(ok);
    });
  }
  return std::unique_ptr<rls_server>(new rls_server(std::move(i), port));
}

void rls_server::shutdown(std::chrono::milliseconds grace) {
  if (impl_->stopped) return;
  impl_->stopped = true;
  impl_->server->Shutdown(std::chrono::system_clock::now() + grace);
  // Calls still deciding (on Redis) answer into their queue: it stays open until the last is gone.
  {
    std::unique_lock lock(impl_->state.mutex);
    impl_->state.none_alive.wait(lock, [&] { return impl_->state.alive == 0; });
  }
  for (auto& q : impl_->queues) q->Shutdown();
  for (auto& t : impl_->threads) t.join();
}

}  // namespace sluice::envoy
