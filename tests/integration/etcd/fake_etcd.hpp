// SPDX-License-Identifier: Apache-2.0
// tests/integration/etcd/fake_etcd.hpp — an etcd that misbehaves on purpose: a real gRPC server on
// 127.0.0.1 (a free port) whose Range and Watch answer as the test says, recording when each full
// read began (a Range at revision 0 is a read's first page).
//
//   sluice::testing::fake_etcd etcd(
//       [](std::size_t read, const etcdserverpb::RangeRequest& req, etcdserverpb::RangeResponse& resp) {
//         resp.set_more(true);              // page after page, forever
//         return grpc::Status::OK;
//       },
//       sluice::testing::fake_etcd::cancel_when_created(0));
//   watcher on etcd.endpoint(); etcd.reads_started() ...
//
// Thread-safe: gRPC's threads call the answers; the getters may be called from any thread.
#pragma once

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "etcd/proto/rpc.grpc.pb.h"

namespace sluice::testing {

class fake_etcd {
 public:
  using clock = std::chrono::steady_clock;
  using watch_stream = grpc::ServerReaderWriter<etcdserverpb::WatchResponse, etcdserverpb::WatchRequest>;
  /// One page: `read` counts the full reads begun before this one's (0 for the first).
  using range_answer =
      std::function<grpc::Status(std::size_t read, const etcdserverpb::RangeRequest&, etcdserverpb::RangeResponse&)>;
  using watch_answer = std::function<void(grpc::ServerContext&, watch_stream&)>;

  fake_etcd(range_answer range, watch_answer watch) : kv_(*this, std::move(range)), watch_(std::move(watch)) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(&kv_);
    b.RegisterService(&watch_);
    server_ = b.BuildAndStart();
    if (!server_ || port_ == 0) throw std::runtime_error("the fake etcd could not listen");
  }
  fake_etcd(const fake_etcd&) = delete;
  fake_etcd& operator=(const fake_etcd&) = delete;
  ~fake_etcd() { server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1)); }

  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }

  /// When each full read began.
  std::vector<clock::time_point> reads_started() const {
    std::lock_guard lock(mu_);
    return reads_;
  }
  /// Range calls answered, every page of every read.
  std::size_t pages() const {
    std::lock_guard lock(mu_);
    return pages_;
  }

  /// A watch that is created, then at once canceled — with `compact_revision` when it is not 0, as
  /// etcd says that the revisions asked for are compacted.
  static watch_answer cancel_when_created(std::int64_t compact_revision) {
    return [compact_revision](grpc::ServerContext&, watch_stream& stream) {
      etcdserverpb::WatchRequest req;
      if (!stream.Read(&req)) return;
      etcdserverpb::WatchResponse created;
      created.set_created(true);
      created.mutable_header()->set_revision(req.create_request().start_revision());
      etcdserverpb::WatchResponse canceled;
      canceled.set_canceled(true);
      canceled.set_compact_revision(compact_revision);
      canceled.set_cancel_reason("canceled by the fake");
      if (!stream.Write(created) || !stream.Write(canceled)) return;
      while (stream.Read(&req)) {
      }  // until the client goes
    };
  }

 private:
  struct kv_service final : etcdserverpb::KV::Service {
    kv_service(fake_etcd& f, range_answer a) : fake(f), answer(std::move(a)) {}
    grpc::Status Range(grpc::ServerContext*, const etcdserverpb::RangeRequest* req,
                       etcdserverpb::RangeResponse* resp) override {
      std::size_t read = 0;
      {
        std::lock_guard lock(fake.mu_);
        if (req->revision() == 0) fake.reads_.push_back(clock::now());
        ++fake.pages_;
        read = fake.reads_.empty() ? 0 : fake.reads_.size() - 1;
      }
      return answer(read, *req, *resp);
    }
    fake_etcd& fake;
    range_answer answer;
  };
  struct watch_service final : etcdserverpb::Watch::Service {
    explicit watch_service(watch_answer a) : answer(std::move(a)) {}
    grpc::Status Watch(grpc::ServerContext* ctx, watch_stream* stream) override {
      answer(*ctx, *stream);
      return grpc::Status::OK;
    }
    watch_answer answer;
  };

  mutable std::mutex mu_;
  std::vector<clock::time_point> reads_;  // guarded by mu_
  std::size_t pages_ = 0;                 // guarded by mu_
  kv_service kv_;
  watch_service watch_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;  // last: shut down before the services go
};

}  // namespace sluice::testing
