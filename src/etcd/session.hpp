// SPDX-License-Identifier: Apache-2.0
// src/etcd/session.hpp (private) — one connection to one etcd endpoint, from connecting to its
// end: authenticate (when a username is set), read the whole prefix at one revision when needed,
// then watch it from the next revision, handing every batch to the publisher. A compaction or a
// canceled watch calls for a full read: over the same connection after a compaction, by the next
// session after a cancel; either waits when it follows the last full read closely.
//
//   session s(options, credentials, endpoint, stop, pub, rereads);
//   session_end end = s.run(must_read);     // returns when the connection is lost or stop() is called
//
// Not thread-safe: it runs on the watcher's thread; only `stop` is shared.
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/security/credentials.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "etcd/backoff.hpp"
#include "etcd/key_range.hpp"
#include "etcd/prefix_state.hpp"
#include "etcd/proto/rpc.grpc.pb.h"
#include "etcd/publisher.hpp"
#include "etcd/stopper.hpp"
#include "sluice/etcd/options.hpp"

namespace sluice::etcd::detail {

/// How a session ended.
struct session_end {
  std::string error;       ///< Why, for watch_status::last_error.
  bool worked = false;     ///< A watch was established: the next backoff starts over.
  bool must_read = false;  ///< The next session starts with a full read.
};

class session {
 public:
  /// `rereads` spaces the full reads of all the sessions of one watcher.
  session(const etcd_options& options, std::shared_ptr<grpc::ChannelCredentials> credentials, std::string endpoint,
          stopper& stop, publisher& pub, reread_pacing& rereads);

  /// Runs until the connection ends. `must_read`: start with a full read (first session, or the
  /// previous one asked for it); else resume the watch at the publisher's revision + 1.
  session_end run(bool must_read);

 private:
  struct watch_end {
    enum class next {
      resume,      // the connection ended: the next session resumes the watch
      read_now,    // compacted: read the prefix again and watch again on this connection
      read_later,  // canceled: the next session reads the prefix again
    };
    std::string error;
    next then = next::resume;
  };

  result<void> authenticate();
  result<prefix_state> read_prefix();
  watch_end watch(std::optional<prefix_state> fresh);
  /// A unary call with the deadline and token; once more after a fresh token on UNAUTHENTICATED.
  grpc::Status unary(const std::function<grpc::Status(grpc::ClientContext&)>& call);
  void add_token(grpc::ClientContext& ctx) const;
  std::string failure(const char* what, const grpc::Status& s) const;

  const etcd_options& options_;
  const key_range range_;
  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  const std::string endpoint_;
  stopper& stop_;
  publisher& pub_;
  reread_pacing& rereads_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<etcdserverpb::KV::Stub> kv_;
  std::unique_ptr<etcdserverpb::Watch::Stub> watch_;
  std::unique_ptr<etcdserverpb::Auth::Stub> auth_;
  std::string token_;
  bool must_read_ = false;  // the next watch needs a full read first
  bool worked_ = false;
};

}  // namespace sluice::etcd::detail
