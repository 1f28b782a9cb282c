// SPDX-License-Identifier: Apache-2.0
// The Redis backend's public face (redis_backend.hpp): options checked, the engine (engine.hpp) made
// on its own io thread or the caller's, checks handed to it, its counters exported.
#include "sluice/redis_backend.hpp"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <algorithm>
#include <future>
#include <optional>
#include <thread>

#include <spdlog/spdlog.h>

#include "core/log_value.hpp"
#include "redis/engine.hpp"
#include "redis/tls.hpp"
#include "sluice/memory_backend.hpp"
#include "sluice/prometheus.hpp"

namespace sluice {
namespace {

namespace asio = boost::asio;
using detail::engine;

// One engine per io_context (the first leads: engine.hpp); a check goes to the engine of the io
// thread that asks, any other thread's to the first.
class redis_backend_impl final : public redis_backend {
 public:
  // Owns an io_context and its thread.
  explicit redis_backend_impl(std::unique_ptr<asio::io_context> io)
      : owned_io_(std::move(io)), work_(owned_io_->get_executor()) {}
  redis_backend_impl() = default;

  void start(std::vector<std::shared_ptr<engine>> engines) {
    engines_ = std::move(engines);
    for (std::size_t i = 1; i < engines_.size(); ++i) engines_[i]->follow(engines_.front());
    for (auto& e : engines_) e->start();
    if (owned_io_) thread_ = std::thread([io = owned_io_.get()] { io->run(); });
  }

  ~redis_backend_impl() override {
    for (auto it = engines_.rbegin(); it != engines_.rend(); ++it) (*it)->shutdown();
    if (owned_io_) {
      work_.reset();
      owned_io_->stop();
      thread_.join();
    }
  }

  // A blocking call made of its async form, which `start` begins with the handler to complete.
  // Refused on the backend's own io thread, where it would wait for itself.
  template <class T, class Start>
  result<T> wait_for(std::string_view call, Start&& start) {
    if (on_io_thread()) {
      return {errc::invalid_argument, std::string(call) + "() blocks and was called on the Redis backend's io thread; use async_" +
                                          std::string(call)};
    }
    auto p = std::make_shared<std::promise<result<T>>>();
    auto f = p->get_future();
    start([p](result<T> r) { p->set_value(std::move(r)); });
    return f.get();
  }

  result<decision> decide(const check_request& req) override {
    return wait_for<decision>("check", [&](auto done) { here().async_check(req, std::move(done)); });
  }

  void async_decide(const check_request& req, check_handler handler) override {
    here().async_check(req, std::move(handler));
  }

  result<std::vector<decision>> decide_all(std::span<const check_request> checks) override {
    return wait_for<std::vector<decision>>("check_all",
                                           [&](auto done) { here().async_check_all(checks, std::move(done)); });
  }

  void async_decide_all(std::span<const check_request> checks, check_all_handler handler) override {
    here().async_check_all(checks, std::move(handler));
  }

  result<void> forget(const check_request& req) override {
    return wait_for<void>("reset", [&](auto done) { here().async_reset(req, std::move(done)); });
  }

  void async_forget(const check_request& req, reset_handler handler) override {
    here().async_reset(req, std::move(handler));
  }

  result<prepared_rule_ptr> prepare(const rule& r) override {
    auto p = leader().prepare(r, this);
    if (!p) return p.error();
    return prepared_rule_ptr(std::move(*p));
  }

  result<void> validate_rule(const rule& r) const override {
    if (auto v = validate(r); !v) return v;
    return validate_for_redis(r);
  }

  bool ready() override {
    return std::all_of(engines_.begin(), engines_.end(), [](const auto& e) { return e->ready(); });
  }
  void give_back_leases() override { leader().leases().give_back_leases(); }

  // Each engine's counters summed, but the topology's, which are the leader's alone.
  redis_backend_stats stats() const override {
    redis_backend_stats sum = leader().stats();
    for (std::size_t i = 1; i < engines_.size(); ++i) {
      const redis_backend_stats s = engines_[i]->stats();
      for (auto field :
           {&redis_backend_stats::checks, &redis_backend_stats::redis_decisions, &redis_backend_stats::calls,
            &redis_backend_stats::timeouts, &redis_backend_stats::unavailable, &redis_backend_stats::protocol_errors,
            &redis_backend_stats::overloaded, &redis_backend_stats::fail_open, &redis_backend_stats::fail_closed,
            &redis_backend_stats::local_fallback, &redis_backend_stats::script_reloads, &redis_backend_stats::connects,
            &redis_backend_stats::circuit_opens, &redis_backend_stats::redirections, &redis_backend_stats::retries,
            &redis_backend_stats::pending}) {
        sum.*field += s.*field;
      }
      sum.circuit_open = sum.circuit_open || s.circuit_open;
      sum.out_of_memory = sum.out_of_memory || s.out_of_memory;
    }
    return sum;
  }

  void append_metrics(std::string& out) override {
    const redis_backend_stats st = stats();
    auto metric = [&out](const char* name, const char* type, const char* help, std::uint64_t v) {
      prometheus::family(out, name, type, help);
      prometheus::sample(out, name, v);
    };
    metric("sluice_redis_checks_total", "counter", "Valid checks sent to the Redis backend.", st.checks);
    metric("sluice_redis_decisions_total", "counter", "Checks Redis decided.", st.redis_decisions);
    metric("sluice_redis_calls_total", "counter", "Script calls sent to Redis (a batch of checks is one).", st.calls);
    metric("sluice_redis_timeouts_total", "counter", "Checks with no Redis answer within timeout_ms.", st.timeouts);
    metric("sluice_redis_unavailable_total", "counter", "Checks failed: connection down or circuit open.",
           st.unavailable);
    metric("sluice_redis_protocol_errors_total", "counter", "Error or malformed Redis replies.", st.protocol_errors);
    metric("sluice_redis_overloaded_total", "counter", "Checks refused because max_pending were waiting.",
           st.overloaded);
    metric("sluice_redis_script_reloads_total", "counter", "NOSCRIPT replies recovered.", st.script_reloads);
    metric("sluice_redis_connects_total", "counter", "Successful Redis connections.", st.connects);
    metric("sluice_redis_circuit_opens_total", "counter", "Times the circuit breaker opened.", st.circuit_opens);
    metric("sluice_redis_pending", "gauge", "Checks waiting on Redis now.", st.pending);
    metric("sluice_redis_circuit_open", "gauge", "1 while checks fail fast.", st.circuit_open ? 1 : 0);
    metric("sluice_redis_out_of_memory", "gauge", "1 while Redis refuses scripts over maxmemory.",
           st.out_of_memory ? 1 : 0);
    leader().leases().append_metrics(out);
    if (leader().sentinel()) {
      metric("sluice_redis_sentinel_master_switches_total", "counter",
             "Times the sentinels moved the master to another address.", st.master_switches);
    }
    if (!leader().cluster()) return;
    metric("sluice_redis_cluster_redirections_total", "counter", "Checks sent on by MOVED, ASK or READONLY.",
           st.redirections);
    metric("sluice_redis_cluster_retries_total", "counter", "Checks retried after TRYAGAIN or CLUSTERDOWN.",
           st.retries);
    metric("sluice_redis_cluster_map_refreshes_total", "counter", "Slot maps read from the cluster.",
           st.topology_refreshes);
    metric("sluice_redis_cluster_masters", "gauge", "Masters in the current slot map.", st.masters);
  }

 private:
  engine& leader() const { return *engines_.front(); }
  // The engine whose io_context runs on this thread; the leader on any other thread.
  engine& here() const {
    for (const auto& e : engines_) {
      if (e->on_io_thread()) return *e;
    }
    return leader();
  }
  bool on_io_thread() const {
    return std::any_of(engines_.begin(), engines_.end(), [](const auto& e) { return e->on_io_thread(); });
  }

  std::unique_ptr<asio::io_context> owned_io_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  std::vector<std::shared_ptr<engine>> engines_;
  std::thread thread_;
};

using detail::topology_kind;

// The servers to connect to: the first address for a single Redis, every one for a cluster (the
// seeds) or Sentinel (the sentinels).
result<std::vector<detail::endpoint>> validate_options(const redis_options& o, topology_kind t) {
  if (o.addresses.empty()) return {errc::invalid_argument, "redis addresses must not be empty"};
  std::vector<detail::endpoint> seeds;
  for (const std::string& a : o.addresses) {
    auto ep = detail::parse_endpoint(a);
    if (!ep) return ep.error();
    seeds.push_back(std::move(*ep));
    if (t == topology_kind::one_server) break;
  }
  const bool cluster = t == topology_kind::cluster;
  if (t == topology_kind::sentinel) {
    // +switch-master names it among words split at spaces.
    if (o.master_name.empty()) return {errc::invalid_argument, "redis master_name must be set for Redis Sentinel"};
    if (o.master_name.size() > 256 || o.master_name.find_first_of(" \t\r\n") != std::string::npos) {
      return {errc::invalid_argument, "redis master_name must be at most 256 bytes, without spaces"};
    }
    if (!o.sentinel_username.empty() && o.sentinel_password.empty()) {
      return {errc::invalid_argument, "redis sentinel_username needs a sentinel_password"};
    }
  }
  if (cluster && o.database != 0) {
    return {errc::invalid_argument, "redis database must be 0 on a Redis Cluster (it has no other)"};
  }
  if (cluster && o.cluster_refresh_interval <= std::chrono::milliseconds::zero()) {
    return {errc::invalid_argument, "redis cluster_refresh_interval must be > 0"};
  }
  if (o.key_prefix.find_first_of("{}") != std::string::npos) {
    return {errc::invalid_argument, "redis key_prefix must not contain '{' or '}' (they would choose the hash slot)"};
  }
  if (o.key_prefix.size() > 256) return {errc::invalid_argument, "redis key_prefix is longer than 256 bytes"};
  if (o.database < 0) return {errc::invalid_argument, "redis database must be >= 0"};
  if (o.wait_replicas < 0 || o.wait_replicas > 64) return {errc::invalid_argument, "redis wait_replicas must be 0..64"};
  if (o.connect_timeout <= std::chrono::milliseconds::zero())
    return {errc::invalid_argument, "redis connect_timeout must be > 0"};
  if (o.command_timeout <= std::chrono::milliseconds::zero())
    return {errc::invalid_argument, "redis command_timeout must be > 0"};
  if (o.max_pending == 0) return {errc::invalid_argument, "redis max_pending must be > 0"};
  if (o.max_batch < 1 || o.max_batch > 1000) return {errc::invalid_argument, "redis max_batch must be 1..1000"};
  if (o.breaker_failure_threshold < 1) return {errc::invalid_argument, "redis breaker_failure_threshold must be >= 1"};
  if (o.breaker_probe_interval <= std::chrono::milliseconds::zero()) {
    return {errc::invalid_argument, "redis breaker_probe_interval must be > 0"};
  }
  // Durations are added to steady_clock::now() in ns: bound them far below overflow.
  constexpr std::chrono::milliseconds max_duration = std::chrono::hours(24);
  if (o.connect_timeout > max_duration || o.command_timeout > max_duration || o.breaker_probe_interval > max_duration ||
      o.error_log_interval > max_duration || o.cluster_refresh_interval > max_duration) {
    return {errc::invalid_argument,
            "redis connect_timeout, command_timeout, breaker_probe_interval, error_log_interval and "
            "cluster_refresh_interval must be <= 24 h"};
  }
  return seeds;
}

// The in-process fallback of on_error = local; none otherwise.
result<std::shared_ptr<memory_backend>> make_local(const redis_options& o) {
  if (o.on_error != failure_policy::local) return std::shared_ptr<memory_backend>();
  memory_backend_options m;
  if (o.clock_for_test) m.clock = o.clock_for_test;
  auto b = make_memory_backend(m);
  if (!b) return b.error();
  return std::shared_ptr<memory_backend>(std::move(*b));
}

// A backend on its own io thread (no io_contexts given), or an engine on each io_context given.
result<std::unique_ptr<redis_backend>> make_backend(const redis_options& options, topology_kind t,
                                                    std::span<asio::io_context* const> ios) {
  auto seeds = validate_options(options, t);
  if (!seeds) return seeds.error();
  if (std::find(ios.begin(), ios.end(), nullptr) != ios.end()) {
    return {errc::invalid_argument, "redis backend: an io_context given is null"};
  }
  auto tls = detail::make_tls_settings(options);
  if (!tls) return tls.error();
  if (options.tls && !options.tls_verify) {
    spdlog::warn(
        "event=redis_tls_unverified message=\"tls_verify = false: any server is accepted, its certificate "
        "unverified\"");
  }
  auto local = make_local(options);
  if (!local) return local.error();
  std::unique_ptr<redis_backend_impl> impl;
  std::vector<asio::io_context*> on(ios.begin(), ios.end());
  if (on.empty()) {
    auto owned = std::make_unique<asio::io_context>(1);
    on.push_back(owned.get());
    impl = std::make_unique<redis_backend_impl>(std::move(owned));
  } else {
    impl = std::make_unique<redis_backend_impl>();
  }
  std::vector<std::shared_ptr<engine>> engines;
  for (asio::io_context* io : on) engines.push_back(std::make_shared<engine>(options, *seeds, t, *tls, *io, *local));
  impl->start(std::move(engines));
  return std::unique_ptr<redis_backend>(std::move(impl));
}

// An engine on each io_context given (at least one).
result<std::unique_ptr<redis_backend>> make_on_threads(const redis_options& options, topology_kind t,
                                                       std::span<asio::io_context* const> io_threads) {
  if (io_threads.empty()) return {errc::invalid_argument, "redis backend: no io_context given"};
  return make_backend(options, t, io_threads);
}

}  // namespace

result<std::unique_ptr<redis_backend>> make_redis_backend(const redis_options& options) {
  return make_backend(options, topology_kind::one_server, {});
}

result<std::unique_ptr<redis_backend>> make_redis_backend(const redis_options& options, asio::io_context& io) {
  asio::io_context* const one[] = {&io};
  return make_backend(options, topology_kind::one_server, one);
}

result<std::unique_ptr<redis_backend>> make_redis_backend(const redis_options& options,
                                                          std::span<asio::io_context* const> io_threads) {
  return make_on_threads(options, topology_kind::one_server, io_threads);
}

result<std::unique_ptr<redis_backend>> make_redis_cluster_backend(const redis_options& options) {
  return make_backend(options, topology_kind::cluster, {});
}

result<std::unique_ptr<redis_backend>> make_redis_cluster_backend(const redis_options& options, asio::io_context& io) {
  asio::io_context* const one[] = {&io};
  return make_backend(options, topology_kind::cluster, one);
}

result<std::unique_ptr<redis_backend>> make_redis_cluster_backend(const redis_options& options,
                                                                  std::span<asio::io_context* const> io_threads) {
  return make_on_threads(options, topology_kind::cluster, io_threads);
}

result<std::unique_ptr<redis_backend>> make_redis_sentinel_backend(const redis_options& options) {
  return make_backend(options, topology_kind::sentinel, {});
}

result<std::unique_ptr<redis_backend>> make_redis_sentinel_backend(const redis_options& options, asio::io_context& io) {
  asio::io_context* const one[] = {&io};
  return make_backend(options, topology_kind::sentinel, one);
}

result<std::unique_ptr<redis_backend>> make_redis_sentinel_backend(const redis_options& options,
                                                                   std::span<asio::io_context* const> io_threads) {
  return make_on_threads(options, topology_kind::sentinel, io_threads);
}

}  // namespace sluice
