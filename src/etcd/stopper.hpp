// SPDX-License-Identifier: Apache-2.0
// src/etcd/stopper.hpp (private) — stops the watcher's thread promptly, whatever it is doing: a
// gRPC call in flight is cancelled (ClientContext::TryCancel), a backoff wait is woken.
//
//   grpc::ClientContext ctx;
//   stopper::call call(stop, ctx);
//   if (!call) return;                       // stopping: the call is not started
//   stub->Range(&ctx, request, &response);   // returns CANCELLED soon after stop.stop()
//
// Thread-safe.
#pragma once

#include <grpcpp/client_context.h>

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace sluice::etcd::detail {

class stopper {
 public:
  /// Registers one call's context for its lifetime, so that stop() cancels it.
  class call {
   public:
    call(stopper& s, grpc::ClientContext& ctx) : s_(s) {
      std::lock_guard lock(s_.mu_);
      if (s_.stopping_) return;
      s_.active_ = &ctx;
      entered_ = true;
    }
    ~call() {
      if (!entered_) return;
      std::lock_guard lock(s_.mu_);
      s_.active_ = nullptr;
    }
    call(const call&) = delete;
    call& operator=(const call&) = delete;
    /// False when the watcher is stopping: do not start the call.
    explicit operator bool() const { return entered_; }

   private:
    stopper& s_;
    bool entered_ = false;
  };

  void stop() {
    std::lock_guard lock(mu_);
    stopping_ = true;
    if (active_ != nullptr) active_->TryCancel();
    wake_.notify_all();
  }

  bool stopping() const {
    std::lock_guard lock(mu_);
    return stopping_;
  }

  /// Waits `d`, or less if stop() is called. Returns false when stopping.
  bool sleep_for(std::chrono::milliseconds d) {
    std::unique_lock lock(mu_);
    return !wake_.wait_for(lock, d, [&] { return stopping_; });
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
  grpc::ClientContext* active_ = nullptr;  // the call in flight, if any
};

}  // namespace sluice::etcd::detail
