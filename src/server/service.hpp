// SPDX-License-Identifier: Apache-2.0
// sluiced's process: N io threads (workers), each with its own io_context and connections, plus
// a control io_context on the main thread for accept, signals, config reload, housekeeping and
// draining.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>

#include "sluice/backend.hpp"
#include "server/metrics.hpp"
#include "core/log_throttle.hpp"
#include "server/config_file_watch.hpp"
#include "server/envoy_source.hpp"
#include "rules/etcd_source.hpp"
#include "server/log_fields.hpp"
#include "rules/rule_sources.hpp"
#include "server/session.hpp"
#include "server/snapshot.hpp"

namespace sluice::server {

class service final : public connection_context {
 public:
  // `workers`: the io threads' io_contexts, made first because the backend may live on them.
  service(std::string config_path, std::vector<std::unique_ptr<worker>> workers, std::shared_ptr<const snapshot> snap,
          std::unique_ptr<sluice::backend> b)
      : workers_(std::move(workers)),
        config_file_(std::move(config_path)),
        backend_(std::move(b)),
        metrics_({.max_tenant_labels = snap->cfg.server.max_tenant_labels}),
        current_(snap),
        file_rules_(snap->cfg.rules),
        file_overrides_(snap->cfg.overrides),
        acceptor_(ioc_),
        signals_(ioc_, SIGTERM, SIGINT, SIGHUP),
        watch_timer_(ioc_),
        drain_timer_(ioc_) {}

  std::shared_ptr<const snapshot> current() const { return current_.load(); }

  // The current config as seen from worker `w`: one atomic load per request (published::read).
  const std::shared_ptr<const snapshot>& current_for(worker& w) const override { return current_.read(w.snap); }
  sluice::backend& backend() override { return *backend_; }
  server::metrics& stats() override { return metrics_; }
  rejection_log& rejections() override { return rejections_; }
  bool draining() const override { return draining_.load(std::memory_order_relaxed); }
  void request_begin() override { in_flight_.fetch_add(1, std::memory_order_relaxed); }
  void request_end() override { in_flight_.fetch_sub(1, std::memory_order_relaxed); }

  // sluiced's own counters, then the backend's (whatever it is), then the requests in flight.
  std::string render_metrics() override;
  // GET /v1/rules for `snap`.
  std::string render_rules(const snapshot& snap) override;

  // Watches [etcd]'s prefix for rules. Before run().
  result<void> start_etcd(const etcd_settings& settings);
  // Serves Envoy's rate-limit API on `server.grpc_listen`, its limits from [envoy]. Before run().
  result<void> start_envoy(const envoy_settings& settings, const server_settings& server);

  // Serves on `endpoint` with one thread per worker until drained, telling `notify` (if set) of its
  // states (server_options::notify). Before run().
  void set_notify(std::function<void(std::string_view)> notify) { notify_ = std::move(notify); }
  int run(const tcp::endpoint& endpoint);

  // A backend on the workers' io_contexts is destroyed with them stopped (run() stops them; a
  // service that never ran stops them here): it then closes its connections on this thread.
  ~service() override {
    for (auto& w : workers_) w->io.stop();
  }

 private:
  void tell(std::string_view state) {
    if (notify_) notify_(state);
  }
  // The configured cap, lowered to what the descriptor limit leaves after reserved_descriptors.
  static std::size_t max_connections(std::size_t configured);

  // An exception escaping a handler (one connection's) is logged and the loop goes on: no request
  // can end the process. The handler's connection is closed as its session is destroyed.
  void run_guarded(asio::io_context& io);

  static std::string endpoint_text(const tcp::endpoint& e);

  // Accepts on the control thread; the session is made on its worker's thread. When descriptors
  // run out, accepting pauses for accept_backoff (the kernel's backlog holds new connections
  // meanwhile) and the failure is logged once per interval with its count.
  void do_accept();

  // Every second, on each worker's own thread: close connections past their deadline, forget ended ones.
  void arm_sweep(worker& w);

  void wait_signal();

  // Polls the config file every `interval` (see config_file_watch for when a change is applied).
  void arm_watch(std::chrono::milliseconds interval);

  // Every second on the control thread: the refusal log's counts; every sweep_interval, idle
  // limiter state (a full bucket, an empty window) is dropped, so memory returns after a key flood.
  void arm_housekeeping();

  // Loads the file again; on success swaps the rules in, keeping the state of unchanged rules.
  void reload(std::string_view trigger);
  bool publish(config settings, std::string_view trigger);
  void apply_etcd();
  std::vector<rule_source_status> sources();

  void begin_drain();

  void poll_drain();

  // Before workers_: sessions destroyed with a worker's io_context still count themselves out.
  std::atomic<int> in_flight_{0};
  // Declared first (but for the above), destroyed last: an accept pending on ioc_ holds a socket of
  // a worker's io_context, so every worker io_context must outlive ioc_.
  std::vector<std::unique_ptr<worker>> workers_;
  std::vector<asio::executor_work_guard<executor>> guards_;
  config_file_watch config_file_;
  asio::io_context ioc_{1};
  std::unique_ptr<sluice::backend> backend_;
  server::metrics metrics_;
  published<snapshot> current_;
  std::mutex reload_mu_;
  std::function<void(std::string_view)> notify_;
  // Guarded by reload_mu_: the file's rules as last loaded, and etcd's (null without [etcd]).
  std::vector<rule> file_rules_;
  std::vector<rule_override> file_overrides_;
  std::unique_ptr<etcd_rules> etcd_rules_;
  std::atomic<std::uint64_t> file_loads_{1};
  std::atomic<std::uint64_t> etcd_errors_{0};
  std::set<std::string> reported_overrides_;  // the overrides left out by the last publish
  std::mutex status_mu_;
  rule_source_status etcd_status_{.name = "etcd", .connected = false};  // guarded by status_mu_
  tcp::acceptor acceptor_;
  asio::signal_set signals_;
  asio::steady_timer watch_timer_;
  asio::steady_timer drain_timer_;
  asio::steady_timer accept_retry_timer_{ioc_};
  asio::steady_timer housekeeping_timer_{ioc_};
  steady::time_point last_sweep_ = steady::now();
  std::size_t max_open_per_worker_ = 1;
  detail::log_throttle accept_failures_{std::chrono::seconds(10)};
  detail::log_throttle handler_exceptions_{std::chrono::seconds(10)};
  rejection_log rejections_;
  std::atomic<bool> draining_{false};
  std::atomic<int> workers_to_drain_{0};
  steady::time_point drain_deadline_;
  std::size_t next_ = 0;                    // the worker the next accepted connection goes to
  std::atomic<int> accepted_unstarted_{0};  // posted to a worker, not yet started (see do_accept)
  // Its limits are prepared on backend_; run() ends it before the backend.
  std::unique_ptr<envoy_source> envoy_;
  // Last: its thread posts to ioc_ and calls into this service until it is joined.
  std::unique_ptr<etcd_source> etcd_;
};

}  // namespace sluice::server
