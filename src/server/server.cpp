// sluiced's HTTP server: N io threads, each with its own io_context and connections (Beast parses
// requests; replies are serialized by hand), plus a control io_context on the main thread for
// accept, signals, config reload and draining. The only file of sluiced that instantiates
// Beast/Asio templates.
#include "sluice/server/server.hpp"

#include <sys/resource.h>
#include <sys/stat.h>

#include <array>
#include <atomic>
#include <chrono>
#include <limits>
#include <csignal>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <spdlog/spdlog.h>

#include "sluice/host_port.hpp"
#include "sluice/http/headers.hpp"
#include "sluice/rule_set.hpp"
#include "sluice/prometheus.hpp"
#include "sluice/server/api.hpp"
#include "sluice/server/metrics.hpp"
#include "core/log_throttle.hpp"
#include "server/request_limits.hpp"

namespace sluice::server {

namespace {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using steady = std::chrono::steady_clock;
using executor = asio::io_context::executor_type;

constexpr auto idle_timeout = std::chrono::seconds(60);
constexpr auto write_timeout = std::chrono::seconds(30);

// Connections kept free for everything but clients (listener, Redis, config file, logs).
constexpr rlim_t reserved_descriptors = 64;
// After accept fails for want of descriptors, wait this long before accepting again.
constexpr auto accept_backoff = std::chrono::milliseconds(100);
// While draining, how long a connection waiting between requests may still send one.
constexpr auto drain_grace = std::chrono::milliseconds(500);
// A config file must keep the same size, mtime and inode this long before it is applied.
constexpr auto reload_settle = std::chrono::milliseconds(500);
// Refusal log lines per second in full; beyond them, one count per rule per second.
constexpr std::size_t rejection_lines_per_second = 20;

// A log field value: bare when it is a plain token, else quoted with escapes, so that a hostile key
// cannot forge fields or lines.
std::string log_value(std::string_view v) {
  bool plain = !v.empty() && v.size() <= 256;
  for (char c : v) {
    if (c <= 0x20 || c >= 0x7f || c == '"' || c == '=' || c == '\\') plain = false;
  }
  if (plain) return std::string(v);
  std::string out = "\"";
  for (std::size_t i = 0; i < v.size() && i < 256; ++i) {
    unsigned char c = static_cast<unsigned char>(v[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (v.size() > 256) out += "...";
  out += '"';
  return out;
}

// `log_rejections`: the first lines of each second are logged in full; the rest are counted per
// rule and reported once a second by flush(), so a flood of refusals cannot flood the log.
class rejection_log {
 public:
  // True when this refusal may be logged in full; otherwise it is counted for `rule`.
  bool admit(std::string_view rule) {
    std::lock_guard lock(mu_);
    if (lines_ < rejection_lines_per_second) {
      ++lines_;
      return true;
    }
    auto it = suppressed_.find(rule);
    if (it == suppressed_.end()) it = suppressed_.emplace(std::string(rule), 0).first;
    ++it->second;
    return false;
  }

  // Called once a second: logs the counts of what was not logged, and starts a new second.
  void flush() {
    std::map<std::string, std::uint64_t, std::less<>> counts;
    {
      std::lock_guard lock(mu_);
      lines_ = 0;
      counts.swap(suppressed_);
    }
    for (const auto& [rule, n] : counts) {
      spdlog::info("event=rejections_not_logged rule={} count={} interval_ms=1000", rule, n);
    }
  }

 private:
  std::mutex mu_;
  std::size_t lines_ = 0;
  std::map<std::string, std::uint64_t, std::less<>> suppressed_;  // rule names come from the config
};

// "application/json", any case, with or without parameters ("; charset=utf-8").
bool is_json_media_type(std::string_view content_type) {
  std::string_view type = content_type.substr(0, content_type.find(';'));
  while (!type.empty() && (type.back() == ' ' || type.back() == '\t')) type.remove_suffix(1);
  while (!type.empty() && (type.front() == ' ' || type.front() == '\t')) type.remove_prefix(1);
  return beast::iequals(beast::string_view(type.data(), type.size()), "application/json");
}

// One loaded configuration and what is derived from it: its rules prepared on the backend, in the
// config's order (rules->rules()[i] is cfg.rules[i]), so a check finds its prepared rule by index.
struct snapshot {
  config cfg;
  std::shared_ptr<const rule_set> rules;
  sluice::http::header_options headers;

  const prepared_rule& prepared(const rule& r) const { return *rules->rules()[static_cast<std::size_t>(&r - cfg.rules.data())]; }
};

// `previous` (may be null): its unchanged rules keep their prepared form, hence their state.
result<std::shared_ptr<const snapshot>> make_snapshot(config cfg, backend& b, const snapshot* previous) {
  auto rules = rule_set::build(b, cfg.rules, {.source = cfg.source}, previous ? previous->rules.get() : nullptr);
  if (!rules) return rules.error();
  auto s = std::make_shared<snapshot>();
  s->headers = {.legacy_fields = cfg.http.legacy_headers, .ietf_fields = cfg.http.ietf_headers};
  s->cfg = std::move(cfg);
  s->rules = std::move(*rules);
  return std::shared_ptr<const snapshot>(std::move(s));
}

// A file's identity for change detection: modification time (ns), size and inode.
struct file_stamp {
  std::int64_t mtime_ns = -1;
  std::int64_t size = -1;
  std::uint64_t inode = 0;
  friend bool operator==(const file_stamp&, const file_stamp&) = default;
};

file_stamp stamp_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  return {static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec,
          static_cast<std::int64_t>(st.st_size), static_cast<std::uint64_t>(st.st_ino)};
}

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

class service;
class session;

// One io thread: its io_context, the connections it owns and their idle sweeper. Everything here is
// touched only from that thread.
struct worker {
  // Connections accepted for this worker whose session has not ended yet. Declared before `io`:
  // sessions still held by its handlers decrement it as the io_context is destroyed.
  std::size_t open = 0;
  asio::io_context io{1};
  asio::steady_timer sweep_timer{io};
  std::vector<std::weak_ptr<session>> sessions;
  // This thread's reference to the current config, with its own reference count (see
  // service::current_for), and the config version it holds.
  std::shared_ptr<const snapshot> snap;
  std::uint64_t version = std::numeric_limits<std::uint64_t>::max();
};

// Coarse monotonic nanoseconds: deadlines need ~ms precision and are read on every request.
std::int64_t coarse_now_ns() { return to_ns(coarse_clock().now()); }

// One connection: read a request, answer it, repeat while keep-alive. Lives on one worker thread;
// backend completions from other threads are posted back to it.
class session : public std::enable_shared_from_this<session> {
 public:
  session(asio::basic_stream_socket<tcp, executor>&& socket, service& svc, worker& w)
      : socket_(std::move(socket)), svc_(svc), worker_(w) {
    ++worker_.open;  // constructed and destroyed on the worker's thread
  }
  ~session();

  // Runs on the worker's thread. At the connection cap, first closes this worker's connection that
  // has waited longest for a request, so that slow or idle clients cannot lock new ones out.
  void start(std::size_t max_open) {
    if (worker_.open > max_open && !close_longest_waiting(worker_)) {
      beast::error_code ec;
      socket_.close(ec);  // nothing can be shed: this connection is refused
      return;
    }
    worker_.sessions.push_back(shared_from_this());
    do_read();
  }

  // SIGTERM: see the definition.
  void drain();

  bool waiting() const { return waiting_; }
  std::int64_t waiting_since() const { return waiting_since_ns_; }
  void shed() {
    beast::error_code ec;
    socket_.close(ec);
  }

  // Called by the worker's sweeper: closes the connection when its current deadline has passed.
  void sweep(std::int64_t now_ns) {
    if (now_ns > deadline_ns_) {
      beast::error_code ec;
      socket_.close(ec);  // pending operations complete with operation_aborted
    }
  }

 private:
  static bool close_longest_waiting(worker& w);
  void count_in_flight();
  void set_deadline(std::chrono::nanoseconds d) { deadline_ns_ = coarse_now_ns() + d.count(); }
  void clear_deadline() { deadline_ns_ = std::numeric_limits<std::int64_t>::max(); }

  void do_read();
  void on_header(beast::error_code ec, std::size_t);
  bool reply_read_error(beast::error_code ec);
  void read_body();
  void on_read(beast::error_code ec, std::size_t);
  void handle();
  void handle_check();
  void on_check_done(std::size_t index, result<decision> r);
  void finish_check();
  void reply(bhttp::status status, std::string_view body, std::string_view content_type);
  void reply_error(const api_error& e);
  void on_write(bool close, beast::error_code ec, std::size_t);
  void close();
  void discard();

  asio::basic_stream_socket<tcp, executor> socket_;
  service& svc_;
  worker& worker_;
  std::int64_t deadline_ns_ = std::numeric_limits<std::int64_t>::max();
  bool waiting_ = false;  // between requests: no byte of the next one parsed yet
  std::int64_t waiting_since_ns_ = 0;
  beast::flat_buffer buffer_{max_buffered_bytes};
  chunk_framing_budget chunk_framing_;  // of the request being read; the parser holds a reference
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  bhttp::request<bhttp::string_body> req_;
  std::string extra_headers_;  // "Name: value\r\n" lines for the response being built
  std::string out_;            // the serialized response
  std::array<char, 4096> discard_buf_;
  std::size_t discarded_ = 0;
  bool counted_ = false;  // this request counts as in flight

  // The check in progress.
  std::shared_ptr<const snapshot> snap_;
  check_batch batch_;
  std::vector<std::optional<result<decision>>> results_;
  std::size_t outstanding_ = 0;
  steady::time_point started_;
};

class service {
 public:
  service(std::string config_path, std::shared_ptr<const snapshot> snap, std::unique_ptr<backend> b)
      : workers_(),
        config_path_(std::move(config_path)),
        backend_(std::move(b)),
        metrics_({.max_tenant_labels = snap->cfg.server.max_tenant_labels}),
        current_(std::move(snap)),
        acceptor_(ioc_),
        signals_(ioc_, SIGTERM, SIGINT, SIGHUP),
        watch_timer_(ioc_),
        drain_timer_(ioc_),
        stamp_(stamp_of(config_path_)) {}

  std::shared_ptr<const snapshot> current() {
    std::lock_guard lock(mu_);
    return current_;
  }

  // The current config as seen from worker `w`: one atomic load per request, and the lock only
  // after a reload. The pointer shares a control block private to the worker, so copying it does
  // not bounce a reference count between cores.
  const std::shared_ptr<const snapshot>& current_for(worker& w) {
    if (w.version != version_.load(std::memory_order_acquire)) {
      std::lock_guard lock(mu_);
      auto holder = std::make_shared<std::shared_ptr<const snapshot>>(current_);
      w.snap = std::shared_ptr<const snapshot>(holder, holder->get());
      w.version = version_.load(std::memory_order_relaxed);
    }
    return w.snap;
  }
  backend& limiter() { return *backend_; }
  server::metrics& stats() { return metrics_; }
  rejection_log& rejections() { return rejections_; }
  bool draining() const { return draining_.load(std::memory_order_relaxed); }
  void request_begin() { in_flight_.fetch_add(1, std::memory_order_relaxed); }
  void request_end() { in_flight_.fetch_sub(1, std::memory_order_relaxed); }

  // sluiced's own counters, then the backend's (whatever it is), then the requests in flight.
  std::string render_metrics() {
    std::string out = metrics_.render({.backend_ready = backend_->ready()});
    backend_->append_metrics(out);
    prometheus::family(out, "sluice_http_requests_in_flight", "gauge",
                       "Requests read and not yet answered (this scrape included).");
    prometheus::sample(out, "sluice_http_requests_in_flight",
                       static_cast<std::int64_t>(in_flight_.load(std::memory_order_relaxed)));
    return out;
  }

  int run(const tcp::endpoint& endpoint, unsigned threads) {
    beast::error_code ec;
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      spdlog::error("event=listen_failed address={} error={}", log_value(endpoint_text(endpoint)), log_value(ec.message()));
      return 1;
    }
    auto snap = current();
    spdlog::info("event=listening address={} threads={} backend={} rules={} enabled={}",
                 endpoint_text(acceptor_.local_endpoint()), threads, to_string(snap->cfg.backend.type),
                 snap->cfg.rules.size(), snap->cfg.enabled);

    // Each io thread runs its own io_context and owns the connections accepted for it
    // (round-robin), as nginx workers do: no strands, no locks between threads on the request path.
    // The main thread runs ioc_: accept, signals, reload and drain, all light.
    for (unsigned i = 0; i < threads; ++i) {
      workers_.push_back(std::make_unique<worker>());
      guards_.emplace_back(workers_.back()->io.get_executor());
    }
    const std::size_t max_open = max_connections(snap->cfg.server.max_connections);
    max_open_per_worker_ = std::max<std::size_t>(1, max_open / workers_.size());
    spdlog::info("event=connection_limit max_connections={}", max_open_per_worker_ * workers_.size());
    for (auto& w : workers_) arm_sweep(*w);
    do_accept();
    wait_signal();
    arm_watch(snap->cfg.server.watch_interval);
    arm_housekeeping();

    std::vector<std::thread> pool;
    for (auto& w : workers_) pool.emplace_back([this, &io = w->io] { run_guarded(io); });
    run_guarded(ioc_);
    for (auto& t : pool) t.join();
    // The backend goes first: completions it still holds (a drain that timed out on Redis) are
    // posted to the stopped io_contexts, which must still exist to take them.
    backend_.reset();
    spdlog::info("event=stopped");
    return 0;
  }

 private:
  // The configured cap, lowered to what the descriptor limit leaves after reserved_descriptors.
  static std::size_t max_connections(std::size_t configured) {
    rlimit lim{};
    if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return configured;
    const rlim_t usable = lim.rlim_cur > 2 * reserved_descriptors ? lim.rlim_cur - reserved_descriptors : lim.rlim_cur / 2;
    return std::min<std::size_t>(configured, std::max<rlim_t>(usable, 1));
  }

  // An exception escaping a handler (one connection's) is logged and the loop goes on: no request
  // can end the process. The handler's connection is closed as its session is destroyed.
  void run_guarded(asio::io_context& io) {
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

  static std::string endpoint_text(const tcp::endpoint& e) {
    std::string a = e.address().to_string();
    if (e.address().is_v6()) a = "[" + a + "]";
    return a + ":" + std::to_string(e.port());
  }

  // Accepts on the control thread; the session is made on its worker's thread. When descriptors
  // run out, accepting pauses for accept_backoff (the kernel's backlog holds new connections
  // meanwhile) and the failure is logged once per interval with its count.
  void do_accept() {
    worker& target = *workers_[next_++ % workers_.size()];
    acceptor_.async_accept(target.io, [this, &target](beast::error_code ec, asio::basic_stream_socket<tcp, executor> socket) {
      if (ec) {
        if (!acceptor_.is_open()) return;  // draining
        if (std::uint64_t n = accept_failures_.occurred()) {
          spdlog::warn("event=accept_failed error={} count={}", log_value(ec.message()), n);
        }
        if (ec == asio::error::no_descriptors || ec == asio::error::no_buffer_space ||
            ec == asio::error::no_memory) {
          accept_retry_timer_.expires_after(accept_backoff);
          accept_retry_timer_.async_wait([this](beast::error_code) { do_accept(); });
          return;
        }
      } else {
        socket.set_option(tcp::no_delay(true), ec);
        asio::post(target.io, [this, &target, socket = std::move(socket)]() mutable {
          std::make_shared<session>(std::move(socket), *this, target)->start(max_open_per_worker_);
        });
      }
      do_accept();
    });
  }

  // Every second, on each worker's own thread: close connections past their deadline, forget ended ones.
  void arm_sweep(worker& w) {
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

  void wait_signal() {
    signals_.async_wait([this](beast::error_code ec, int sig) {
      if (ec) return;
      if (sig == SIGHUP) {
        spdlog::info("event=signal signal=SIGHUP");
        reload("sighup");
        wait_signal();
        return;
      }
      spdlog::info("event=signal signal={} action=drain", sig == SIGTERM ? "SIGTERM" : "SIGINT");
      begin_drain();
    });
  }

  // Polls the file's stamp. A change is applied once the stamp has held for reload_settle, so a
  // file caught while being written in place is not applied half-written (writing a new file and
  // renaming it over the old one is atomic, and the way to update).
  void arm_watch(std::chrono::milliseconds interval) {
    if (interval.count() == 0 || draining()) return;
    watch_timer_.expires_after(pending_stamp_ ? std::min<std::chrono::milliseconds>(interval, reload_settle) : interval);
    watch_timer_.async_wait([this](beast::error_code ec) {
      if (ec) return;
      const file_stamp now = stamp_of(config_path_);
      if (now == stamp_) {
        pending_stamp_.reset();
      } else if (!pending_stamp_ || !(*pending_stamp_ == now)) {
        pending_stamp_ = now;  // changed (again): wait for it to settle
        pending_since_ = steady::now();
      } else if (steady::now() - pending_since_ >= reload_settle) {
        pending_stamp_.reset();
        reload("file_change");
      }
      arm_watch(current()->cfg.server.watch_interval);
    });
  }

  // Every second on the control thread: the refusal log's counts; every sweep_interval, idle
  // limiter state (a full bucket, an empty window) is dropped, so memory returns after a key flood.
  void arm_housekeeping() {
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

  // Loads the file again; on success swaps the rules in, keeping the state of unchanged rules.
  void reload(std::string_view trigger) {
    std::lock_guard reload_lock(reload_mu_);
    stamp_ = stamp_of(config_path_);
    auto loaded = load_config(config_path_);
    if (loaded) {
      if (auto s = check_servable(*loaded); !s) loaded = s.error();
    }
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
    next.backend = old->cfg.backend;
    next.server.listen = old->cfg.server.listen;
    next.server.threads = old->cfg.server.threads;
    const bool enabled = next.enabled;
    auto snap = make_snapshot(std::move(next), *backend_, old.get());
    if (!snap) {
      metrics_.record_reload(false);
      spdlog::error("event=reload result=failure trigger={} error={}", trigger, log_value(snap.error().message));
      return;
    }
    // Checks already running keep the old snapshot, and with it the old rules' state; new checks
    // get the new one, where a changed rule starts afresh.
    const std::size_t rules = (*snap)->rules->size();
    const std::size_t reset = old->rules->size() - (*snap)->rules->kept();
    {
      std::lock_guard lock(mu_);
      current_ = std::move(*snap);
      version_.fetch_add(1, std::memory_order_release);
    }
    metrics_.record_reload(true);
    spdlog::info("event=reload result=success trigger={} rules={} enabled={} reset_rules={} version={}", trigger,
                 rules, enabled, reset, current()->rules->version());
  }

  void begin_drain() {
    if (draining_.exchange(true)) return;
    beast::error_code ec;
    acceptor_.close(ec);
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

  void poll_drain() {
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

  // Before workers_: sessions destroyed with a worker's io_context still count themselves out.
  std::atomic<int> in_flight_{0};
  // Declared first (but for the above), destroyed last: an accept pending on ioc_ holds a socket of
  // a worker's io_context, so every worker io_context must outlive ioc_.
  std::vector<std::unique_ptr<worker>> workers_;
  std::vector<asio::executor_work_guard<executor>> guards_;
  std::string config_path_;
  asio::io_context ioc_{1};
  std::unique_ptr<backend> backend_;
  server::metrics metrics_;
  std::mutex mu_;
  std::shared_ptr<const snapshot> current_;
  std::atomic<std::uint64_t> version_{0};
  std::mutex reload_mu_;
  tcp::acceptor acceptor_;
  asio::signal_set signals_;
  asio::steady_timer watch_timer_;
  asio::steady_timer drain_timer_;
  asio::steady_timer accept_retry_timer_{ioc_};
  asio::steady_timer housekeeping_timer_{ioc_};
  file_stamp stamp_;
  std::optional<file_stamp> pending_stamp_;  // a change waiting to settle
  steady::time_point pending_since_;
  steady::time_point last_sweep_ = steady::now();
  std::size_t max_open_per_worker_ = 1;
  detail::log_throttle accept_failures_{std::chrono::seconds(10)};
  detail::log_throttle handler_exceptions_{std::chrono::seconds(10)};
  rejection_log rejections_;
  std::atomic<bool> draining_{false};
  std::atomic<int> workers_to_drain_{0};
  steady::time_point drain_deadline_;
  std::size_t next_ = 0;
};

session::~session() {
  --worker_.open;
  if (counted_) svc_.request_end();  // ended by an exception mid-request
}

bool session::close_longest_waiting(worker& w) {
  std::shared_ptr<session> oldest;
  for (const auto& weak : w.sessions) {
    auto s = weak.lock();
    if (s && s->waiting() && (!oldest || s->waiting_since() < oldest->waiting_since())) oldest = std::move(s);
  }
  if (!oldest) return false;
  oldest->shed();
  return true;
}

// A connection waiting between requests may have been promised keep-alive by the last response:
// its client may be sending the next request right now. It gets drain_grace to do so (answered,
// with Connection: close); silent, it is closed. A connection mid-request is answered with
// Connection: close and closed after.
void session::drain() {
  if (!waiting_) return;
  count_in_flight();
  deadline_ns_ = std::min(deadline_ns_, coarse_now_ns() + std::chrono::nanoseconds(drain_grace).count());
}

void session::count_in_flight() {
  if (counted_) return;
  svc_.request_begin();
  counted_ = true;
}

void session::do_read() {
  parser_.emplace();
  apply_request_limits(*parser_, chunk_framing_);
  waiting_ = true;
  waiting_since_ns_ = coarse_now_ns();
  set_deadline(idle_timeout);
  if (svc_.draining()) drain();
  bhttp::async_read_header(socket_, buffer_, *parser_,
                           beast::bind_front_handler(&session::on_header, shared_from_this()));
}

// Answers a request that could not be read, then closes: 431 for headers over the limit, 413 for a
// body (or its chunk framing) over the limit, 400 for a malformed request. Returns false when the
// connection should just be closed (timeout, reset).
bool session::reply_read_error(beast::error_code ec) {
  const bool in_header = waiting_ || !parser_->is_header_done();
  waiting_ = false;
  count_in_flight();
  req_ = {};
  req_.keep_alive(false);
  extra_headers_.clear();
  if (ec == bhttp::error::header_limit || (ec == bhttp::error::buffer_overflow && in_header)) {
    reply_error({431, "header_too_large",
                 "the request line and headers are larger than " + std::to_string(max_header_bytes) + " bytes"});
    return true;
  }
  if (ec == bhttp::error::body_limit || ec == bhttp::error::buffer_overflow) {
    std::string message = chunk_framing_.exceeded || ec == bhttp::error::buffer_overflow
                              ? "the chunked framing (chunk lines, extensions, trailers) is larger than " +
                                    std::to_string(max_chunk_framing_bytes) + " bytes"
                              : "the body is larger than " + std::to_string(max_body_bytes) + " bytes";
    reply_error({413, "payload_too_large", std::move(message)});
    return true;
  }
  if (ec.category() == bhttp::make_error_code(bhttp::error::bad_method).category() &&
      ec != bhttp::error::partial_message && ec != bhttp::error::end_of_stream) {
    reply_error({400, "invalid_request", "malformed HTTP request: " + ec.message()});
    return true;
  }
  return false;
}

void session::on_header(beast::error_code ec, std::size_t) {
  if (ec == bhttp::error::end_of_stream) return close();
  if (ec) {
    if (!reply_read_error(ec)) close();
    return;
  }
  // From here the request is in flight: SIGTERM waits for it.
  waiting_ = false;
  count_in_flight();
  set_deadline(write_timeout);
  const auto& h = parser_->get();
  if (!parser_->is_done() && beast::iequals(h[bhttp::field::expect], "100-continue")) {
    static constexpr std::string_view continue_line = "HTTP/1.1 100 Continue\r\n\r\n";
    asio::async_write(socket_, asio::buffer(continue_line.data(), continue_line.size()),
                     [self = shared_from_this()](beast::error_code ec, std::size_t) {
                       if (ec) return self->close();
                       self->read_body();
                     });
    return;
  }
  read_body();
}

void session::read_body() {
  bhttp::async_read(socket_, buffer_, *parser_, beast::bind_front_handler(&session::on_read, shared_from_this()));
}

void session::on_read(beast::error_code ec, std::size_t) {
  if (ec) {
    if (!reply_read_error(ec)) close();
    return;
  }
  req_ = parser_->release();
  extra_headers_.clear();
  handle();
}

void session::handle() {
  auto t = req_.target();
  std::string_view target(t.data(), t.size());
  if (auto q = target.find('?'); q != std::string_view::npos) target = target.substr(0, q);
  auto method = req_.method();
  bool get = method == bhttp::verb::get || method == bhttp::verb::head;

  if (target == "/v1/check") {
    if (method != bhttp::verb::post) return reply_error({405, "method_not_allowed", "use POST for /v1/check"});
    return handle_check();
  }
  if (target == "/healthz" || target == "/readyz" || target == "/metrics") {
    if (!get) return reply_error({405, "method_not_allowed", "use GET for " + std::string(target)});
    if (target == "/healthz") return reply(bhttp::status::ok, "{\"status\":\"ok\"}", "application/json");
    if (target == "/readyz") {
      if (svc_.draining()) return reply(bhttp::status::service_unavailable, "{\"status\":\"draining\"}", "application/json");
      if (svc_.limiter().ready()) return reply(bhttp::status::ok, "{\"status\":\"ready\"}", "application/json");
      return reply(bhttp::status::service_unavailable, "{\"status\":\"backend_unavailable\"}", "application/json");
    }
    return reply(bhttp::status::ok, svc_.render_metrics(), "text/plain; version=0.0.4; charset=utf-8");
  }
  reply_error({404, "not_found", "no endpoint " + std::string(target.substr(0, 128))});
}

void session::handle_check() {
  // A browser may send a cross-origin text/plain or form POST without asking first; requiring JSON
  // makes it ask (CORS preflight), so no page can spend a key's budget.
  auto content_type = req_[bhttp::field::content_type];
  if (!is_json_media_type({content_type.data(), content_type.size()})) {
    return reply_error({415, "unsupported_media_type", "POST /v1/check needs Content-Type: application/json"});
  }
  snap_ = svc_.current_for(worker_);
  auto parsed = parse_check_body(req_.body(), snap_->cfg);
  if (auto* e = std::get_if<api_error>(&parsed)) return reply_error(*e);
  batch_ = std::move(std::get<check_batch>(parsed));
  results_.assign(batch_.items.size(), std::nullopt);
  started_ = steady::now();
  clear_deadline();       // the backend has its own timeout
  outstanding_ = 1;       // held until every check is issued, so an inline completion cannot finish early
  for (std::size_t i = 0; i < batch_.items.size(); ++i) {
    const check_item& item = batch_.items[i];
    if (item.error) continue;
    if (!snap_->cfg.enabled) {
      results_[i] = disabled_decision(*item.rule);
      continue;
    }
    ++outstanding_;
    check_request req = item.request();
    req.prepared = &snap_->prepared(*item.rule);
    svc_.limiter().async_check(req, [self = shared_from_this(), i](result<decision> r) {
      // Inline completions (memory backend) run here and now; Redis completes on its own thread
      // and is posted back to this connection's thread.
      auto ex = self->socket_.get_executor();
      asio::dispatch(ex, [self, i, r = std::move(r)]() mutable { self->on_check_done(i, std::move(r)); });
    });
  }
  if (--outstanding_ == 0) finish_check();
}

void session::on_check_done(std::size_t index, result<decision> r) {
  results_[index] = std::move(r);
  if (--outstanding_ == 0) finish_check();
}

void session::finish_check() {
  auto latency = steady::now() - started_;
  const auto& cfg = snap_->cfg;
  for (std::size_t i = 0; i < batch_.items.size(); ++i) {
    const check_item& item = batch_.items[i];
    if (item.error || !results_[i]) continue;
    const result<decision>& r = *results_[i];
    if (!r) {
      svc_.stats().record_backend_error(item.rule->name, r.error(), latency);
      spdlog::warn("event=check_failed rule={} error={}", item.rule->name, log_value(r.error().message));
      continue;
    }
    svc_.stats().record_decision(item.rule->name, item.tenant, *r, latency);
    if (!r->allowed && cfg.server.log_rejections && svc_.rejections().admit(item.rule->name)) {
      if (item.rule->is_dual_layer()) {
        spdlog::info("event=check rate_limited=true rule={} tenant={} user={} rejected_by={}", item.rule->name,
                     log_value(item.tenant), log_value(item.user), to_string(r->rejected_by));
      } else {
        spdlog::info("event=check rate_limited=true rule={} user={}", item.rule->name, log_value(item.key));
      }
    }
  }

  if (!batch_.batch) {
    const check_item& item = batch_.items[0];
    const result<decision>& r = *results_[0];
    if (!r) return reply_error(backend_error(r.error()));
    for (auto& f : sluice::http::rate_limit_headers(*r, *item.rule, std::chrono::system_clock::now(), snap_->headers)) {
      extra_headers_ += f.name;
      extra_headers_ += ": ";
      extra_headers_ += f.value;
      extra_headers_ += "\r\n";
    }
    return reply(r->allowed ? bhttp::status::ok : bhttp::status::too_many_requests, render_decision(*item.rule, *r),
                 "application/json");
  }
  std::string body = "{\"results\":[";
  for (std::size_t i = 0; i < batch_.items.size(); ++i) {
    if (i) body += ',';
    const check_item& item = batch_.items[i];
    if (item.error) {
      body += render_error(*item.error);
    } else if (!*results_[i]) {
      body += render_error(backend_error(results_[i]->error()));
    } else {
      body += render_decision(*item.rule, results_[i]->value());
    }
  }
  body += "]}";
  reply(bhttp::status::ok, body, "application/json");
}

void session::reply_error(const api_error& e) {
  if (e.status == 405) extra_headers_ += req_.target().starts_with("/v1/") ? "Allow: POST\r\n" : "Allow: GET, HEAD\r\n";
  reply(static_cast<bhttp::status>(e.status), render_error(e), "application/json");
}

// Serializes the response by hand (status line, extra_headers_, body) and writes it in one send:
// cheaper than Beast's serializer for these small, fixed-shape answers.
void session::reply(bhttp::status status, std::string_view body, std::string_view content_type) {
  int code = static_cast<int>(status);
  bool keep_alive = req_.keep_alive() && !svc_.draining() && code != 413;
  auto reason = bhttp::obsolete_reason(status);
  out_.clear();
  out_ += "HTTP/1.1 ";
  out_ += std::to_string(code);
  out_ += ' ';
  out_.append(reason.data(), reason.size());
  out_ += "\r\nServer: sluiced\r\nContent-Type: ";
  out_ += content_type;
  out_ += "\r\n";
  out_ += extra_headers_;
  out_ += "Content-Length: ";
  out_ += std::to_string(body.size());
  out_ += "\r\n";
  if (!keep_alive) {
    out_ += "Connection: close\r\n";
  } else if (req_.version() == 10) {
    out_ += "Connection: keep-alive\r\n";
  }
  out_ += "\r\n";
  if (req_.method() != bhttp::verb::head) out_ += body;
  svc_.stats().record_response(code);
  set_deadline(write_timeout);
  asio::async_write(socket_, asio::buffer(out_),
                   beast::bind_front_handler(&session::on_write, shared_from_this(), !keep_alive));
}

void session::on_write(bool close_after, beast::error_code ec, std::size_t) {
  if (counted_) {
    counted_ = false;
    svc_.request_end();
  }
  snap_.reset();
  batch_ = {};
  results_.clear();
  // The client was promised keep-alive: a drain that began meanwhile is handled in do_read.
  if (ec || close_after) return close();
  do_read();
}

void session::close() {
  if (counted_) {
    counted_ = false;
    svc_.request_end();
  }
  // Half-close, then read and discard what the client still sends (e.g. the rest of a body over the
  // limit) until it closes too: closing with unread data would reset the connection and could make
  // the client lose the response.
  beast::error_code ec;
  socket_.shutdown(tcp::socket::shutdown_send, ec);
  if (ec) return (void)socket_.close(ec);
  set_deadline(std::chrono::seconds(2));
  discard();
}

void session::discard() {
  if (discarded_ > 4 * max_body_bytes) {
    beast::error_code ec;
    socket_.close(ec);
    return;
  }
  socket_.async_read_some(asio::buffer(discard_buf_), [self = shared_from_this()](beast::error_code ec, std::size_t n) {
    self->discarded_ += n;
    if (ec) {
      beast::error_code ignored;
      self->socket_.close(ignored);
      return;
    }
    self->discard();
  });
}

}  // namespace

int run(const server_options& options) {
  auto cfg = load_config(options.config_path);
  if (!cfg) {
    spdlog::error("event=config_invalid error={}", log_value(cfg.error().message));
    return 1;
  }
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
  auto b = make_backend(cfg->backend);
  if (!b) {
    spdlog::error("event=backend_failed error={}", log_value(b.error().message));
    return 1;
  }
  unsigned threads = cfg->server.threads;
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());

  // SIGPIPE would kill the process on a write to a closed socket; Asio reports EPIPE instead.
  std::signal(SIGPIPE, SIG_IGN);
  int rc = 0;
  {
    auto snap = make_snapshot(std::move(*cfg), **b, nullptr);
    if (!snap) {
      spdlog::error("event=config_invalid error={}", log_value(snap.error().message));
      return 1;
    }
    service svc(options.config_path, std::move(*snap), std::move(*b));
    rc = svc.run(*endpoint, threads);
  }
  return rc;
}

}  // namespace sluice::server
