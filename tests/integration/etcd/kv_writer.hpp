// SPDX-License-Identifier: Apache-2.0
// tests/integration/etcd/kv_writer.hpp — puts over gRPC (KV.Put of src/etcd/proto), for tests that
// write thousands of keys: etcdctl starts a process per call.
//
//   sluice::testing::kv_writer kv(etcd.endpoint());
//   std::int64_t rev = kv.put("/sluice/a", "1");
//
// Thread-safe: concurrent puts share one channel.
#pragma once

#include <grpcpp/create_channel.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "etcd/proto/rpc.grpc.pb.h"

namespace sluice::testing {

class kv_writer {
 public:
  explicit kv_writer(const std::string& endpoint)
      : kv_(etcdserverpb::KV::NewStub(grpc::CreateChannel(endpoint, grpc::InsecureChannelCredentials()))) {}

  /// Sets `key` to `value`; returns the revision of the change. Throws when etcd refuses.
  std::int64_t put(const std::string& key, const std::string& value) const {
    etcdserverpb::PutRequest req;
    req.set_key(key);
    req.set_value(value);
    etcdserverpb::PutResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::Status s = kv_->Put(&ctx, req, &resp);
    if (!s.ok()) throw std::runtime_error("put " + key + " failed: " + s.error_message());
    return resp.header().revision();
  }

 private:
  std::unique_ptr<etcdserverpb::KV::Stub> kv_;
};

}  // namespace sluice::testing
