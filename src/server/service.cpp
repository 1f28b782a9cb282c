// SPDX-License-Identifier: Apache-2.0
#include "server/service.hpp"

#include <sys/resource.h>

#include <csignal>
#include <thread>
#include <unordered_set>
#include <utility>

#include <spdlog/spdlog.h>

#include "sluice/prometheus.hpp"
#include "server/backend_factory.hpp"
#include "server/process_metrics.hpp"
#include "server/server.hpp"
#include "rules/rule_sources.hpp"

namespace sluice::server {

namespace {

// Descriptors kept free for everything but clients' sessions (listener, Redis, config file, logs,
// and up to max_accepted_unstarted sockets on their way to a worker).
constexpr rlim_t reserved_descriptors = 64;
// A socket accepted and not yet started by its worker is not counted against the cap: at most this
// many wait at once, so that workers lagging behind a burst of connections cannot make the acceptor
// run the process out of descriptors.
constexpr int max_accepted_unstarted = 16;
// After accept fails for want of descriptors, wait this long before accepting again.
constexpr auto accept_backoff = std::chrono::milliseconds(100);

}  // namespace

// sluiced's own counters, then the backend's (whatever it is), then the requests in flight, the
// build and the process.
std::string service::render_metrics() {
  metrics_gauges gauges{.backend_ready = backend_->ready()};
  for (const rule& r : current()->cfg.rules) gauges.rules.push_back(r.name);
  std::string out = metrics_.render(gauges);
  backend_->append_metrics(out);
  const auto all = sources();
  prometheus::family(out, "sluice_config_source_up", "gauge",
                     "1 when the source of rules is current (the file is; etcd: its watch is live).");
  for (const auto& s : all)
    prometheus::sample(out, "sluice_config_source_up{source=\"" + s.name + "\"}", std::int64_t{s.connected ? 1 : 0});
  prometheus::family(out, "sluice_config_revision", "gauge",
                     "The version of each source in force: the file's successful loads, etcd's store revision.");
  for (const auto& s : all) prometheus::sample(out, "sluice_config_revision{source=\"" + s.name + "\"}", s.revision);
  prometheus::family(
      out, "sluice_config_errors_total", "counter",
      "Rules refused, by source: a file that failed to load, an etcd value that failed to parse or validate "
      "or was over the watcher's bounds.");
  prometheus::sample(out, "sluice_config_errors_total{source=\"file\"}", metrics_.reload_failures());
  if (etcd_)
    prometheus::sample(out, "sluice_config_errors_total{source=\"etcd\"}",
                       etcd_errors_.load(std::memory_order_relaxed));
  if (envoy_) envoy_->append_metrics(out);
  prometheus::family(out, "sluice_http_requests_in_flight", "gauge",
                     "Requests read and not yet answered (this scrape included).");
  prometheus::sample(out, "sluice_http_requests_in_flight",
                     static_cast<std::int64_t>(in_flight_.load(std::memory_order_relaxed)));
  prometheus::family(out, "sluice_build_info", "gauge", "1, labelled with the version of sluiced.");
  prometheus::sample(out, "sluice_build_info{version=\"" SLUICE_VERSION "\"}", std::int64_t{1});
  append_process_metrics(out);
  return out;
}

int service::run(const tcp::endpoint& endpoint) {
  beast::error_code ec;
  acceptor_.open(endpoint.protocol(), ec);
  if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(endpoint, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    spdlog::error("event=listen_failed address={} error={}", log_value(endpoint_text(endpoint)),
                  log_value(ec.message()));
    return 1;
  }
  auto snap = current();
  spdlog::info("event=listening address={} threads={} backend={} rules={} enabled={}",
               endpoint_text(acceptor_.local_endpoint()), workers_.size(), to_string(snap->cfg.backend.type),
               snap->cfg.rules.size(), snap->cfg.enabled);

  // Each io thread runs its own io_context and owns the connections accepted for it
  // (round-robin), as nginx workers do: no strands, no locks between threads on the request path.
  // The main thread runs ioc_: accept, signals, reload and drain, all light.
  for (auto& w : workers_) guards_.emplace_back(w->io.get_executor());
  const std::size_t max_open = max_connections(snap->cfg.server.max_connections);
  max_open_per_worker_ = std::max<std::size_t>(1, max_open / workers_.size());
  spdlog::info("event=connection_limit max_connections={}", max_open_per_worker_ * workers_.size());
  for (auto& w : workers_) arm_sweep(*w);
  do_accept();
  wait_signal();
  arm_watch(snap->cfg.server.watch_interval);
  arm_housekeeping();
  tell("READY=1");

  std::vector<std::thread> pool;
  for (auto& w : workers_) pool.emplace_back([this, &io = w->io] { run_guarded(io); });
  run_guarded(ioc_);
  for (auto& t : pool) t.join();
  // The Envoy API's limits are prepared on the backend: it ends first.
  if (envoy_) envoy_->shutdown();
  envoy_.reset();
  // The backend goes first: completions it still holds (a drain that timed out on Redis) are
  // posted to the stopped io_contexts, which must still exist to take them.
  backend_.reset();
  spdlog::info("event=stopped");
  return 0;
}

// The configured cap, lowered to what the descriptor limit leaves after reserved_descriptors.
std::size_t service::max_connections(std::size_t configured) {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return configured;
  const rlim_t usable =
      lim.rlim_cur > 2 * reserved_descriptors ? lim.rlim_cur - reserved_descriptors : lim.rlim_cur / 2;
  return std::min<std::size_t>(configured, std::max<rlim_t>(usable, 1));
}

// An exception escaping a handler (one connection's) is logged and the loop goes on: no request
// can end the process. The handler's connection is closed as its session is destroyed.
void service::run_guarded(asio::io_context& io) {
  for (;;) {
    try {
      io.run();
      return;
    } catch (const std::exception& e) {
      if (std::uint64_t n = handler_exceptions_.occurred()) {
        spdlog::error("event=handler_exception error={} count={}", log_value(e.what()), n);
      }
    } catch (...) {
      if (std::uint64_t n = handler_exceptions_.occurred()) {
        spdlog::error("event=handler_exception error=unknown count={}", n);
      }
    }
  }
}

std::string service::endpoint_text(const tcp::endpoint& e) {
  std::string a = e.address().to_string();
  if (e.address().is_v6()) a = "[" + a + "]";
  return a + ":" + std::to_string(e.port());
}

// Accepts on the control thread; the session is made on its worker's thread. Accepting pauses
// (the kernel's backlog holds new connections meanwhile) while max_accepted_unstarted sockets wait
// for their worker, until one is started; and for accept_backoff when descriptors run out anyway,
// the failure logged once per interval with its count.
void service::do_accept() {
  worker& target = *workers_[next_++ % workers_.size()];
  acceptor_.async_accept(
      target.io, [this, &target](beast::error_code ec, asio::basic_stream_socket<tcp, executor> socket) {
        if (ec) {
          if (!acceptor_.is_open()) return;  // draining
          if (std::uint64_t n = accept_failures_.occurred()) {
            spdlog::warn("event=accept_failed error={} count={}", log_value(ec.message()), n);
          }
          if (ec == asio::error::no_descriptors || ec == asio::error::no_buffer_space || ec == asio::error::no_memory) {
            accept_retry_timer_.expires_after(accept_backoff);
            accept_retry_timer_.async_wait([this](beast::error_code) { do_accept(); });
            return;
          }
        } else {
          socket.set_option(tcp::no_delay(true), ec);
          // Counted before the post, so that the worker's decrement always follows it.
          const bool full = accepted_unstarted_.fetch_add(1) + 1 == max_accepted_unstarted;
          asio::post(target.io, [this, &target, socket = std::move(socket)]() mutable {
            std::make_shared<session>(std::move(socket), *this, target)->start(max_open_per_worker_);
            if (accepted_unstarted_.fetch_sub(1) == max_accepted_unstarted) {
              asio::post(ioc_, [this] { do_accept(); });  // the acceptor paused for this start
            }
          });
          if (full) return;
        }
        do_accept();
      });
}

// Every second, on each worker's own thread: close connections past their deadline, forget ended ones.
void service::arm_sweep(worker& w) {
  // While draining, deadlines are drain_grace short: look more often.
  w.sweep_timer.expires_after(draining() ? std::chrono::milliseconds(50) : std::chrono::milliseconds(1000));
  w.sweep_timer.async_wait([this, &w](beast::error_code ec) {
    if (ec) return;
    std::int64_t now = coarse_now_ns();
    std::erase_if(w.sessions, [now](const std::weak_ptr<session>& weak) {
      auto s = weak.lock();
      if (!s) return true;
      s->sweep(now);
      return false;
    });
    arm_sweep(w);
  });
}

void service::wait_signal() {
  signals_.async_wait([this](beast::error_code ec, int sig) {
    if (ec) return;
    if (sig == SIGHUP) {
      spdlog::info("event=signal signal=SIGHUP");
      reload("sighup");
      if (envoy_) envoy_->reload("sighup");
      wait_signal();
      return;
    }
    spdlog::info("event=signal signal={} action=drain", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    begin_drain();
  });
}

// Polls the config file every `interval` (see config_file_watch for when a change is applied).
void service::arm_watch(std::chrono::milliseconds interval) {
  if (interval.count() == 0 || draining()) return;
  watch_timer_.expires_after(config_file_.settling() ? std::min(interval, config_file_watch::settle) : interval);
  watch_timer_.async_wait([this](beast::error_code ec) {
    if (ec) return;
    if (config_file_.changed(steady::now())) reload("file_change");
    if (envoy_) envoy_->poll();
    arm_watch(current()->cfg.server.watch_interval);
  });
}

void service::arm_housekeeping() {
  housekeeping_timer_.expires_after(std::chrono::seconds(1));
  housekeeping_timer_.async_wait([this](beast::error_code ec) {
    if (ec) return;
    rejections_.flush();
    const auto interval = current()->cfg.server.sweep_interval;
    if (interval.count() > 0 && steady::now() - last_sweep_ >= interval) {
      backend_->sweep_idle();
      last_sweep_ = steady::now();
    }
    arm_housekeeping();
  });
}

namespace {

// The names of `before`'s rules that `after` does not have, for a log field: at most 10 of them.
std::string removed_rules(const std::vector<rule>& before, const config& after) {
  std::unordered_set<std::string_view> kept;
  for (const rule& r : after.rules) kept.insert(r.name);
  std::string names;
  std::size_t count = 0;
  for (const rule& r : before) {
    if (kept.contains(r.name)) continue;
    if (++count <= 10) names += (names.empty() ? "" : ",") + r.name;
  }
  if (count > 10) names += ",+" + std::to_string(count - 10) + " more";
  return names;
}

}  // namespace

// Loads the file again; on success its rules (under etcd's, when etcd is a source) are swapped in.
// A file written in place and read mid-write looks like one whose last rules were removed: a change
// seen by the watch that removes rules waits until the file has held still for settle_removal.
void service::reload(std::string_view trigger) {
  std::lock_guard reload_lock(reload_mu_);
  tell("RELOADING=1");
  struct ready_again {
    service& s;
    ~ready_again() { s.tell("READY=1"); }
  } ready{*this};
  const config_file_watch::stamp read = config_file_.current();
  auto loaded = load_config(config_file_.path());
  if (loaded) {
    if (auto s = check_servable(*loaded); !s) loaded = s.error();
  }
  const std::string removed = loaded ? removed_rules(file_rules_, *loaded) : std::string();
  if (!removed.empty() && trigger == "file_change" && config_file_.hold_removal(steady::now())) {
    spdlog::warn(
        "event=reload_deferred trigger={} rules_removed={} wait_ms={} message=\"applied once the file has "
        "not changed for that long\"",
        trigger, log_value(removed), std::chrono::milliseconds(config_file_watch::settle_removal).count());
    return;
  }
  config_file_.mark_loaded(read);
  if (!loaded) {
    metrics_.record_reload(false);
    spdlog::error("event=reload result=failure trigger={} error={}", trigger, log_value(loaded.error().message));
    return;
  }
  auto old = current();
  config& next = *loaded;
  // Settings read only at start keep their running values; say so instead of half-applying them.
  if (next.server.threads != old->cfg.server.threads) {
    spdlog::warn("event=reload_restart_needed section=server message=\"threads applies at the next start\"");
  }
  if (next.backend != old->cfg.backend) {
    spdlog::warn("event=reload_restart_needed section=backend message=\"[backend] applies at the next start\"");
  }
  if (next.envoy != old->cfg.envoy || next.server.grpc_listen != old->cfg.server.grpc_listen ||
      next.server.grpc != old->cfg.server.grpc) {
    spdlog::warn("event=reload_restart_needed section=envoy message=\"[envoy] and grpc_* apply at the next start\"");
  }
  next.envoy = old->cfg.envoy;
  next.server.grpc_listen = old->cfg.server.grpc_listen;
  next.server.grpc = old->cfg.server.grpc;
  if (next.log != old->cfg.log) {
    spdlog::warn("event=reload_restart_needed section=log message=\"[log] applies at the next start\"");
  }
  next.log = old->cfg.log;
  if (next.etcd != old->cfg.etcd) {
    spdlog::warn("event=reload_restart_needed section=etcd message=\"[etcd] applies at the next start\"");
  }
  next.backend = old->cfg.backend;
  next.etcd = old->cfg.etcd;
  next.server.listen = old->cfg.server.listen;
  next.server.threads = old->cfg.server.threads;
  std::vector<rule> file_rules = next.rules;
  std::vector<rule_override> file_overrides = next.overrides;
  // Before the outcome's line, which stays the last of a reload.
  if (!removed.empty()) spdlog::warn("event=reload_removes_rules trigger={} rules={}", trigger, log_value(removed));
  if (!publish(std::move(next), trigger)) {
    metrics_.record_reload(false);
    return;
  }
  file_rules_ = std::move(file_rules);
  file_overrides_ = std::move(file_overrides);
  file_loads_.fetch_add(1, std::memory_order_relaxed);
  metrics_.record_reload(true);
}

// `settings` with its rules from the file; etcd's rules are merged over them. Called under reload_mu_.
bool service::publish(config settings, std::string_view trigger) {
  merged_rules merged = merge_rules(settings.rules, etcd_rules_.get());
  settings.rules = std::move(merged.rules);
  settings.overrides = merge_overrides(settings.overrides, etcd_rules_.get());
  auto old = current();
  const bool enabled = settings.enabled;
  auto built = make_snapshot(std::move(settings), std::move(merged.origins), *backend_, old.get());
  if (!built) {
    spdlog::error("event=reload result=failure trigger={} error={}", trigger, log_value(built.error().message));
    return false;
  }
  // Overrides left out (their rule gone, or of another algorithm now): each logged once.
  std::set<std::string> rejected(built->rejected_overrides.begin(), built->rejected_overrides.end());
  for (const std::string& why : rejected) {
    if (reported_overrides_.contains(why)) continue;
    etcd_errors_.fetch_add(1, std::memory_order_relaxed);
    spdlog::error("event=config_rejected source=override error={}", log_value(why));
  }
  reported_overrides_ = std::move(rejected);
  std::shared_ptr<const snapshot>& snap = built->snap;
  // Checks already running keep the old snapshot; new checks get the new one, where a rule whose
  // limits alone changed keeps its keys' state and any other change starts afresh.
  const std::size_t rules = snap->rules->size();
  const std::size_t changed = rules - snap->rules->kept();
  const std::size_t overrides = snap->override_count;
  current_.publish(std::move(snap));
  spdlog::info("event=reload result=success trigger={} rules={} overrides={} enabled={} changed_rules={} version={}",
               trigger, rules, overrides, enabled, changed, current()->rules->version());
  return true;
}

// Starts the watch of [etcd]'s prefix: its rules join the file's as they arrive.
result<void> service::start_envoy(const envoy_settings& settings, const server_settings& server) {
  auto e = envoy_source::start(settings, server.grpc_listen, server.grpc, *backend_);
  if (!e) return e.error();
  envoy_ = std::move(*e);
  return {};
}

result<void> service::start_etcd(const etcd_settings& settings) {
  etcd_rules_ = std::make_unique<etcd_rules>(settings.options.prefix,
                                             [this](const rule& r) { return backend_->validate_rule(r); });
  auto source = etcd_source::start(settings, [this] { asio::post(ioc_, [this] { apply_etcd(); }); });
  if (!source) return source.error();
  etcd_ = std::move(*source);
  return {};
}

// On the control thread, after etcd's prefix or connection changed (coalesced).
void service::apply_etcd() {
  std::lock_guard reload_lock(reload_mu_);
  etcd_source::state state = etcd_->read();
  rule_source_status before;
  {
    std::lock_guard lock(status_mu_);
    before = std::exchange(etcd_status_, state.status);
  }
  if (!follow_etcd(*etcd_rules_, state.values, state.status, before, etcd_errors_)) return;
  config settings = current()->cfg;
  settings.rules = file_rules_;
  settings.overrides = file_overrides_;
  if (!publish(std::move(settings), "etcd")) etcd_errors_.fetch_add(1, std::memory_order_relaxed);
}

std::vector<rule_source_status> service::sources() {
  std::vector<rule_source_status> out;
  out.push_back({.name = "file",
                 .connected = true,
                 .revision = static_cast<std::int64_t>(file_loads_.load(std::memory_order_relaxed)),
                 .detail = config_file_.path()});
  if (etcd_) {
    std::lock_guard lock(status_mu_);
    out.push_back(etcd_status_);
  }
  return out;
}

std::string service::render_rules(const snapshot& snap) {
  return server::render_rules(snap.cfg.rules, snap.origins, snap.cfg.overrides, snap.rules->version(), sources());
}

void service::begin_drain() {
  if (draining_.exchange(true)) return;
  tell("STOPPING=1");
  beast::error_code ec;
  acceptor_.close(ec);
  // gRPC calls running are answered within the drain timeout, beside the HTTP drain; new ones are refused.
  if (envoy_) envoy_->begin_shutdown(current()->cfg.server.drain_timeout);
  watch_timer_.cancel();
  housekeeping_timer_.cancel();
  accept_retry_timer_.cancel();
  signals_.cancel();
  drain_deadline_ = steady::now() + current()->cfg.server.drain_timeout;
  // Each worker tells its connections; until all have, "nothing in flight" proves nothing.
  workers_to_drain_.store(static_cast<int>(workers_.size()));
  for (auto& w : workers_) {
    asio::post(w->io, [this, &w = *w] {
      for (const auto& weak : w.sessions) {
        if (auto s = weak.lock()) s->drain();
      }
      w.sweep_timer.cancel();  // re-armed at the draining pace
      arm_sweep(w);
      workers_to_drain_.fetch_sub(1);
    });
  }
  poll_drain();
}

void service::poll_drain() {
  int n = in_flight_.load();
  if ((n == 0 && workers_to_drain_.load() == 0) || steady::now() >= drain_deadline_) {
    spdlog::info("event=drained abandoned_requests={}", n);
    guards_.clear();
    for (auto& w : workers_) w->io.stop();
    ioc_.stop();
    return;
  }
  drain_timer_.expires_after(std::chrono::milliseconds(5));
  drain_timer_.async_wait([this](beast::error_code) { poll_drain(); });
}
}  // namespace sluice::server
