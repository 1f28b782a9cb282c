// SPDX-License-Identifier: Apache-2.0
// sluiced's entry: loads the config, makes the backend and the first snapshot, and runs the service.
#include "server/server.hpp"

#include <csignal>
#include <thread>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <spdlog/spdlog.h>

#include "sluice/host_port.hpp"
#include "server/backend_factory.hpp"
#include "server/log_fields.hpp"
#include "server/log_format.hpp"
#include "server/service.hpp"

namespace sluice::server {

namespace {

result<tcp::endpoint> resolve_listen(const std::string& listen) {
  auto address = parse_host_port(listen);
  if (!address) return error(errc::config_invalid, "listen " + address.error().message);
  const std::string& host = address->host;
  const std::string port = std::to_string(address->port);
  asio::io_context io;
  tcp::resolver resolver(io);
  boost::system::error_code ec;
  auto results = resolver.resolve(host, port, tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || results.empty()) {
    return error(errc::config_invalid, "cannot resolve listen address \"" + listen + "\": " + ec.message());
  }
  return results.begin()->endpoint();
}

}  // namespace

int run(const server_options& options) {
  auto cfg = load_config(options.config_path);
  if (!cfg) {
    spdlog::error("event=config_invalid error={}", log_value(cfg.error().message));
    return 1;
  }
  apply_log_settings(cfg->log);  // [log] from here on
  spdlog::info("event=start version={} config={}", SLUICE_VERSION, log_value(options.config_path));
  if (options.listen) cfg->server.listen = *options.listen;
  if (auto s = check_servable(*cfg); !s) {
    spdlog::error("event=config_invalid error={}", log_value(s.error().message));
    return 1;
  }
  auto endpoint = resolve_listen(cfg->server.listen);
  if (!endpoint) {
    spdlog::error("event=config_invalid error={}", log_value(endpoint.error().message));
    return 1;
  }
  unsigned threads = cfg->server.threads;
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  // The io threads' io_contexts: a Redis backend keeps its connections on each.
  std::vector<std::unique_ptr<worker>> workers;
  std::vector<asio::io_context*> io_threads;
  for (unsigned i = 0; i < threads; ++i) {
    workers.push_back(std::make_unique<worker>());
    io_threads.push_back(&workers.back()->io);
  }
  // Until the service owns them: on a return before, the io_contexts, which never ran, are stopped
  // before the backend goes, so that it closes its connections on this thread.
  struct stop_unrun {
    std::vector<asio::io_context*>* io_threads;
    ~stop_unrun() {
      if (io_threads) for (auto* io : *io_threads) io->stop();
    }
  } stop_before_return{&io_threads};
  auto b = make_backend(cfg->backend, io_threads);
  if (!b) {
    spdlog::error("event=backend_failed error={}", log_value(b.error().message));
    return 1;
  }

  // SIGPIPE would kill the process on a write to a closed socket; Asio reports EPIPE instead.
  std::signal(SIGPIPE, SIG_IGN);
  int rc = 0;
  {
    const etcd_settings etcd = cfg->etcd;
    const envoy_settings envoy = cfg->envoy;
    const server_settings server = cfg->server;
    auto built = make_snapshot(std::move(*cfg), {}, **b, nullptr);
    if (!built) {
      spdlog::error("event=config_invalid error={}", log_value(built.error().message));
      return 1;
    }
    if (!built->rejected_overrides.empty()) {  // the file's overrides were checked at load
      spdlog::error("event=config_invalid error={}", log_value(built->rejected_overrides.front()));
      return 1;
    }
    service svc(options.config_path, std::move(workers), std::move(built->snap), std::move(*b));
    svc.set_notify(options.notify);
    stop_before_return.io_threads = nullptr;  // the service's own destructor does it now
    if (etcd.enabled) {
      if (auto started = svc.start_etcd(etcd); !started) {
        spdlog::error("event=config_invalid error={}", log_value(started.error().message));
        return 1;
      }
    }
    if (!server.grpc_listen.empty()) {
      if (auto started = svc.start_envoy(envoy, server); !started) {
        spdlog::error("event=config_invalid error={}", log_value(started.error().message));
        return 1;
      }
    }
    rc = svc.run(*endpoint);
  }
  return rc;
}

}  // namespace sluice::server
