// SPDX-License-Identifier: Apache-2.0
#include "etcd/channel.hpp"

#include <grpcpp/create_channel.h>
#include <grpcpp/support/channel_arguments.h>

#include <fstream>
#include <sstream>

#include "etcd/proto/rpc.grpc.pb.h"
#include "sluice/host_port.hpp"

namespace sluice::etcd::detail {
namespace {

result<std::string> read_pem(const std::string& option, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  if (in) text << in.rdbuf();
  if (!in || text.str().empty()) {
    return error(errc::invalid_argument, "etcd: " + option + " \"" + path + "\" cannot be read or is empty");
  }
  return text.str();
}

// gRPC says why a connection failed only through a call: one small Range, made only when the
// channel has already failed, brings its reason (refused, TLS handshake, name resolution).
std::string connection_failure(const std::shared_ptr<grpc::Channel>& channel, const std::string& endpoint,
                               stopper& stop) {
  auto kv = etcdserverpb::KV::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
  etcdserverpb::RangeRequest req;
  req.set_key("\0", 1);
  req.set_count_only(true);
  etcdserverpb::RangeResponse resp;
  grpc::Status s;
  if (stopper::call call(stop, ctx); call) s = kv->Range(&ctx, req, &resp);
  return "cannot connect to " + endpoint + (s.error_message().empty() ? "" : ": " + s.error_message());
}

}  // namespace

result<std::shared_ptr<grpc::ChannelCredentials>> make_credentials(const etcd_options& o) {
  if (o.ca_file.empty() && o.cert_file.empty() && o.key_file.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  if (!o.ca_file.empty()) {
    auto ca = read_pem("ca_file", o.ca_file);
    if (!ca) return ca.error();
    ssl.pem_root_certs = std::move(*ca);
  }
  if (!o.cert_file.empty()) {
    auto cert = read_pem("cert_file", o.cert_file);
    if (!cert) return cert.error();
    auto key = read_pem("key_file", o.key_file);
    if (!key) return key.error();
    ssl.pem_cert_chain = std::move(*cert);
    ssl.pem_private_key = std::move(*key);
  }
  return grpc::SslCredentials(ssl);
}

std::shared_ptr<grpc::Channel> make_channel(const std::string& endpoint,
                                            const std::shared_ptr<grpc::ChannelCredentials>& credentials) {
  grpc::ChannelArguments args;
  // A channel of its own for each attempt: no subchannel (and its reconnect backoff) is shared
  // with an earlier attempt, so a restarted etcd is reached at the next attempt.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // An idle watch sends nothing: pings find a peer that vanished without closing the connection.
  // etcd refuses pings more often than every 5 s (--grpc-keepalive-min-time).
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10'000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5'000);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetMaxReceiveMessageSize(max_message_bytes);
  auto hp = parse_host_port(endpoint);  // validated by create(); the target is rebuilt from its parts
  const std::string target = hp->host.find(':') != std::string::npos ? "[" + hp->host + "]:" + std::to_string(hp->port)
                                                                     : hp->host + ":" + std::to_string(hp->port);
  return grpc::CreateCustomChannel(target, credentials, args);
}

result<void> wait_connected(const std::shared_ptr<grpc::Channel>& channel, const std::string& endpoint,
                            std::chrono::milliseconds timeout, stopper& stop) {
  using clock = std::chrono::system_clock;  // gRPC deadlines are system_clock time points
  const auto deadline = clock::now() + timeout;
  for (auto state = channel->GetState(true); state != GRPC_CHANNEL_READY; state = channel->GetState(true)) {
    if (state == GRPC_CHANNEL_TRANSIENT_FAILURE || state == GRPC_CHANNEL_SHUTDOWN) {
      return error(errc::backend_unavailable, connection_failure(channel, endpoint, stop));
    }
    if (stop.stopping()) return error(errc::cancelled, "stopping");
    const auto now = clock::now();
    if (now >= deadline) {
      return error(errc::backend_timeout, "no connection to " + endpoint + " within dial_timeout (" +
                                              std::to_string(timeout.count()) + " ms)");
    }
    // In slices, so that stopping is seen within 50 ms.
    channel->WaitForStateChange(state, std::min(deadline, now + std::chrono::milliseconds(50)));
  }
  return {};
}

}  // namespace sluice::etcd::detail
