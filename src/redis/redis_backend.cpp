// The Redis backend: what ties the pieces of src/redis together — a check's way from async_check
// to its decision.
//
// A check is built on the caller's thread (command.hpp: its keys, arguments and server-side
// deadline), then posted to the strand, sent on the connection (connection.hpp: hiredis pipelines
// it behind the others) and completed by the first of: its reply, its deadline, the connection's
// loss. What Redis cannot answer follows on_error here; the circuit breaker (breaker.hpp) stops
// paying the timeout while Redis is down. Everything touching the connection runs on `strand_`.
#include "sluice/redis_backend.hpp"

#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <deque>
#include <future>
#include <optional>
#include <thread>

#include "core/log_throttle.hpp"
#include "redis/breaker.hpp"
#include "redis/command.hpp"
#include "redis/connection.hpp"
#include "redis/scripts.hpp"
#include "redis/server_clock.hpp"
#include "redis/strand.hpp"
#include "sluice/memory_backend.hpp"
#include "sluice/prometheus.hpp"

namespace sluice {
namespace {

namespace asio = boost::asio;
using detail::scripts;
using detail::strand_type;
using steady = std::chrono::steady_clock;

// What prepare() makes of a rule: its script call, and the rule as the local fallback prepared it.
struct redis_prepared_rule final : prepared_rule {
  redis_prepared_rule(const rule& r, const backend* owner) : prepared_rule(r, owner) {}
  detail::prepared_script call;
  prepared_rule_ptr local;  // on_error = local only
};

// One check on its way through the backend.
struct op {
  check_request req;                                // views valid until the handler runs
  const redis_prepared_rule* rule = nullptr;        // the caller's (valid as the views), or `made`
  std::shared_ptr<const redis_prepared_rule> made;  // prepared for this check alone
  check_handler handler;
  detail::command command;  // EVALSHA, formatted once
  steady::time_point deadline;
  bool done = false;
  bool resent = false;  // sent again as EVAL after NOSCRIPT
};

using op_ptr = std::shared_ptr<op>;

// Rate-limited error log: the first error logs at once, later ones are counted and reported with
// the next line, at most one line per interval.
class error_log {
 public:
  explicit error_log(std::chrono::milliseconds interval) : throttle_(interval) {}

  void report(std::string_view what) {
    if (std::uint64_t n = throttle_.occurred()) {
      spdlog::warn("sluice redis backend: {} ({} error(s) since the last report)", what, n);
    }
  }

 private:
  detail::log_throttle throttle_;
};

class redis_core : public std::enable_shared_from_this<redis_core> {
  // What a command sent on the connection carries to its reply.
  struct in_flight {
    op_ptr o;
    redis_core* core;
  };

 public:
  redis_core(const redis_options& o, detail::endpoint ep, asio::io_context& io, std::unique_ptr<memory_backend> local)
      : options_(o),
        io_(io),
        strand_(asio::make_strand(io)),
        deadline_timer_(strand_),
        oom_probe_timer_(strand_),
        breaker_(strand_, o),
        // The connection's events run on the strand, before do_shutdown closes it: `this` is alive.
        conn_(std::make_shared<detail::connection>(
            strand_, std::move(ep), o,
            detail::connection::events{.opened = [this] { send_unsent(); },
                                       .ready = [this] { on_ready(); },
                                       .lost = [this](const std::string& why) { lost(why); },
                                       .server_time = [this](std::int64_t us) { observe_server_time(us); }})),
        local_(std::move(local)),
        log_(o.error_log_interval) {}

  void start() {
    asio::post(strand_, [self = shared_from_this()] { self->conn_->connect(); });
  }

  // Fails everything still waiting and closes the connection. Must not run on the io threads
  // unless inside the strand.
  void shutdown() {
    if (strand_.running_in_this_thread() || io_.stopped()) {
      // On a stopped io_context nothing runs the strand, nor can anything run on it meanwhile
      // (destroying the backend while another thread restarts the io_context is not allowed):
      // shut down right here, or the connection and its socket would never be freed.
      do_shutdown();
      return;
    }
    auto done = std::make_shared<std::promise<void>>();
    auto f = done->get_future();
    asio::post(strand_, [self = shared_from_this(), done] {
      self->do_shutdown();
      done->set_value();
    });
    f.wait();
  }

  bool on_io_thread() const { return io_.get_executor().running_in_this_thread(); }

  // What prepare() makes and the local fallback's own prepared form of the rule, which keeps the
  // fallback's state for as long as the prepared rule is held.
  result<std::shared_ptr<redis_prepared_rule>> prepare(const rule& r, const backend* owner) const {
    auto p = prepare_script(r, owner);
    if (!p || !local_) return p;
    auto l = local_->prepare(r);
    if (!l) return l.error();
    (*p)->local = std::move(*l);
    return p;
  }

  void async_check(const check_request& req, const backend* owner, check_handler handler) {
    if (!handler) handler = [](result<decision>) {};
    if (auto v = validate(req); !v) {
      handler(v.error());
      return;
    }
    // A rule not prepared here is prepared now, for this check (its local fallback finds the rule
    // by name): its parameters go into the script, so a bad one is the caller's error, not Redis's.
    std::shared_ptr<const redis_prepared_rule> made;
    const redis_prepared_rule* prepared = nullptr;
    if (req.prepared != nullptr && req.prepared->owner() == owner) {
      prepared = static_cast<const redis_prepared_rule*>(req.prepared);
    } else {
      auto p = prepare_script(*req.rule, owner);
      if (!p) {
        handler(p.error());
        return;
      }
      made = std::move(*p);
      prepared = made.get();
    }
    checks_.fetch_add(1, std::memory_order_relaxed);
    if (pending_.fetch_add(1, std::memory_order_relaxed) >= options_.max_pending) {
      pending_.fetch_sub(1, std::memory_order_relaxed);
      overloaded_.fetch_add(1, std::memory_order_relaxed);
      log_.report("too many checks waiting (max_pending = " + std::to_string(options_.max_pending) + ")");
      handler(failure_decision(req, *prepared, errc::backend_overloaded));
      return;
    }
    auto o = std::make_shared<op>();
    o->req = req;
    o->rule = prepared;
    o->made = std::move(made);
    o->handler = std::move(handler);
    build(*o);
    asio::post(strand_, [self = shared_from_this(), o = std::move(o)]() mutable { self->submit(std::move(o)); });
  }

  bool ready() const {
    return ready_.load(std::memory_order_relaxed) && !out_of_memory_.load(std::memory_order_relaxed);
  }

  redis_backend_stats stats() const {
    redis_backend_stats s;
    s.checks = checks_.load(std::memory_order_relaxed);
    s.redis_decisions = redis_decisions_.load(std::memory_order_relaxed);
    s.timeouts = timeouts_.load(std::memory_order_relaxed);
    s.unavailable = unavailable_.load(std::memory_order_relaxed);
    s.protocol_errors = protocol_errors_.load(std::memory_order_relaxed);
    s.overloaded = overloaded_.load(std::memory_order_relaxed);
    s.fail_open = fail_open_.load(std::memory_order_relaxed);
    s.fail_closed = fail_closed_.load(std::memory_order_relaxed);
    s.local_fallback = local_fallback_.load(std::memory_order_relaxed);
    s.script_reloads = script_reloads_.load(std::memory_order_relaxed);
    s.connects = connects_.load(std::memory_order_relaxed);
    s.circuit_opens = breaker_.opens();
    s.pending = pending_.load(std::memory_order_relaxed);
    s.circuit_open = breaker_.is_open_now();
    s.out_of_memory = out_of_memory_.load(std::memory_order_relaxed);
    return s;
  }

  void forget_rule(std::string_view name) {
    if (local_) local_->forget_rule(name);
  }

 private:
  // --- preparing and building (caller's thread) ---------------------------------------------------

  // The rule's script call (command.hpp), validated, in a prepared rule of this backend.
  static result<std::shared_ptr<redis_prepared_rule>> prepare_script(const rule& r, const backend* owner) {
    auto call = detail::prepare_script(r);
    if (!call) return call.error();
    auto p = std::make_shared<redis_prepared_rule>(r, owner);
    p->call = std::move(*call);
    return p;
  }

  void build(op& o) {
    const std::int64_t now = options_.clock_for_test ? to_ns(options_.clock_for_test->now()) / 1000 : -1;
    o.command = detail::evalsha_command(o.rule->call, o.rule->definition(), o.req, options_.key_prefix, now,
                                        server_deadline_us());
  }

  // The latest server time (µs) at which this check may still be applied: our own deadline (from
  // now: the op's deadline, set later in submit(), is no earlier) moved to the server's clock
  // (server_clock.hpp). A call Redis runs later records nothing (see scripts.cpp). -1 while no
  // offset is known yet, and with a test clock (its `now` is passed in instead).
  std::int64_t server_deadline_us() const {
    if (options_.clock_for_test) return -1;
    return server_clock_.deadline_us(detail::server_clock::local_now_us(), options_.command_timeout);
  }

  void observe_server_time(std::int64_t server_us) {
    server_clock_.observe(server_us, detail::server_clock::local_now_us());
  }

  // --- on the strand ----------------------------------------------------------------------------

  void submit(op_ptr o) {
    if (stopping_) return fail(o, errc::backend_unavailable, "backend is shutting down");
    if (breaker_.is_open()) return fail(o, errc::backend_unavailable, "circuit open");
    o->deadline = steady::now() + options_.command_timeout;
    if (conn_->resolving()) {
      // The host name is being resolved: send once connected, if still within the deadline.
      unsent_.push_back(o);
    } else if (!conn_->open()) {
      return fail(o, errc::backend_unavailable, "not connected");
    } else if (!send(o)) {
      return;
    }
    inflight_.push_back(std::move(o));
    arm_deadline();
  }

  // Checks that waited for the host name to resolve go right behind the new connection's handshake.
  void send_unsent() {
    auto waiting = std::move(unsent_);
    unsent_.clear();
    for (auto& o : waiting) {
      if (!o->done) send(o);
    }
  }

  bool send(const op_ptr& o) {
    const std::string* command = &o->command.text;
    std::string eval;
    if (o->resent) {
      // EVAL with the script's body instead of EVALSHA with its hash; the rest is the same.
      eval = detail::eval_command(o->command, scripts()[o->rule->call.script].body);
      command = &eval;
    }
    auto* box = new in_flight{o, this};
    if (!conn_->send(*command, &redis_core::on_reply, box)) {
      delete box;
      fail(o, errc::backend_unavailable, "cannot queue the command on the connection");
      return false;
    }
    return true;
  }

  static void on_reply(redisAsyncContext*, void* reply_ptr, void* privdata) {
    auto* box = static_cast<in_flight*>(privdata);
    op_ptr o = std::move(box->o);
    redis_core* self = box->core;
    delete box;
    self->handle_reply(o, static_cast<redisReply*>(reply_ptr));
  }

  void handle_reply(const op_ptr& o, redisReply* reply) {
    if (o->done) return;  // timed out already
    if (reply == nullptr) {
      // The connection is going away; its loss is handled (and counted for the breaker) once.
      fail(o, errc::backend_unavailable, "connection lost");
      return;
    }
    if (reply->type == REDIS_REPLY_ERROR) {
      std::string_view msg(reply->str, reply->len);
      if (msg.starts_with("NOSCRIPT") && !o->resent && conn_->open()) {
        // The server forgot the script (SCRIPT FLUSH, restart): send its body; EVAL caches it again.
        o->resent = true;
        script_reloads_.fetch_add(1, std::memory_order_relaxed);
        send(o);
        return;
      }
      breaker_.succeeded();  // Redis answered: the connection is healthy
      if (msg.starts_with("OOM")) set_out_of_memory(true);
      fail(o, errc::backend_protocol, "Redis error: " + std::string(msg.substr(0, 200)));
      return;
    }
    breaker_.succeeded();
    set_out_of_memory(false);
    if (std::int64_t t = detail::reply_time(*reply); t >= 0) observe_server_time(t);
    if (detail::is_expired_reply(*reply)) {
      fail(o, errc::backend_timeout, "the check reached Redis after its deadline; nothing was recorded");
      return;
    }
    auto d = detail::parse_reply(o->rule->call, *reply);
    if (!d) {
      fail(o, errc::backend_protocol, d.error().message);
      return;
    }
    redis_decisions_.fetch_add(1, std::memory_order_relaxed);
    complete(o, std::move(d));
    trim_inflight();
  }

  void complete(const op_ptr& o, result<decision> r) {
    o->done = true;
    check_handler h = std::move(o->handler);
    pending_.fetch_sub(1, std::memory_order_relaxed);
    h(std::move(r));
  }

  void fail(const op_ptr& o, errc code, std::string_view why) {
    if (o->done) return;
    switch (code) {
      case errc::backend_timeout: timeouts_.fetch_add(1, std::memory_order_relaxed); break;
      case errc::backend_protocol: protocol_errors_.fetch_add(1, std::memory_order_relaxed); break;
      default: unavailable_.fetch_add(1, std::memory_order_relaxed); break;
    }
    if (!stopping_) log_.report(why);
    auto d = failure_decision(o->req, *o->rule, code);
    o->done = true;
    check_handler h = std::move(o->handler);
    pending_.fetch_sub(1, std::memory_order_relaxed);
    h(std::move(d));
  }

  // What on_error decides for a check Redis could not answer. Thread-safe.
  result<decision> failure_decision(const check_request& req, const redis_prepared_rule& prepared, errc) {
    const rule& r = *req.rule;
    switch (options_.on_error) {
      case failure_policy::allow:
        fail_open_.fetch_add(1, std::memory_order_relaxed);
        return full_capacity_decision(r, decision_source::fail_open);
      case failure_policy::deny: {
        fail_closed_.fetch_add(1, std::memory_order_relaxed);
        decision d;
        d.limit = r.limit.capacity();
        if (r.is_dual_layer()) {
          d.dual_layer = true;
          d.user.limit = r.limit.capacity();
          d.tenant.limit = r.tenant->capacity();
        }
        d.retry_after = std::chrono::seconds(1);
        d.source = decision_source::fail_closed;
        return d;
      }
      case failure_policy::local: {
        local_fallback_.fetch_add(1, std::memory_order_relaxed);
        check_request local_req = req;
        local_req.prepared = prepared.local.get();
        auto l = local_->check(local_req);
        if (l) l->source = decision_source::local_fallback;
        return l;
      }
    }
    return error(errc::backend_unavailable, "no failure policy");
  }

  // --- deadlines --------------------------------------------------------------------------------

  void trim_inflight() {
    while (!inflight_.empty() && inflight_.front()->done) inflight_.pop_front();
  }

  // One timer for all checks: they share one timeout, so inflight_ is in deadline order.
  void arm_deadline() {
    trim_inflight();
    if (inflight_.empty() || deadline_armed_) return;
    deadline_armed_ = true;
    deadline_timer_.expires_at(inflight_.front()->deadline);
    deadline_timer_.async_wait(asio::bind_executor(strand_, [self = shared_from_this()](boost::system::error_code) {
      self->deadline_armed_ = false;
      if (self->stopping_) return;
      self->expire_due();
    }));
  }

  void expire_due() {
    const auto now = steady::now();
    std::vector<op_ptr> expired;
    while (!inflight_.empty()) {
      op_ptr o = inflight_.front();
      if (!o->done && o->deadline > now) break;
      inflight_.pop_front();
      if (!o->done) expired.push_back(std::move(o));
    }
    const bool trip_now = breaker_.failed(expired.size());
    const std::string why = std::to_string(breaker_.consecutive_failures()) + " consecutive failures";
    // Open the circuit before completing: a caller woken by this timeout already sees it open.
    if (trip_now) open_circuit(why);
    for (const auto& o : expired) fail(o, errc::backend_timeout, "no reply within command_timeout");
    if (trip_now && conn_->open()) conn_->drop(why);
    arm_deadline();
  }

  // --- the connection's events, the breaker, out of memory ---------------------------------------

  void on_ready() {
    ready_.store(true, std::memory_order_relaxed);
    connects_.fetch_add(1, std::memory_order_relaxed);
    breaker_.succeeded();
    if (breaker_.close()) spdlog::info("sluice redis backend: connected to {}; circuit closed", conn_->address());
  }

  // The connection is gone (or never came): fail fast until a probe reconnects.
  void lost(const std::string& why) {
    auto waiting = std::move(unsent_);
    unsent_.clear();
    for (auto& o : waiting) fail(o, errc::backend_unavailable, why);
    ready_.store(false, std::memory_order_relaxed);
    if (stopping_) return;
    log_.report(why);
    open_circuit(why);
  }

  void open_circuit(const std::string& why) {
    if (breaker_.open()) {
      spdlog::warn("sluice redis backend: circuit open ({}); checks follow on_error until {} answers", why,
                   conn_->address());
    }
    // A probe is a new connection; its handshake PING closes the circuit.
    breaker_.probe_while_open([self = shared_from_this()] {
      if (!self->conn_->open()) self->conn_->connect();
    });
  }

  // While Redis refuses scripts for want of memory (OOM), readiness is false, and a probe that is
  // refused the same way (command.hpp's oom_probe_command) checks every breaker_probe_interval
  // whether memory is back, so readiness returns even with no checks coming.
  void set_out_of_memory(bool oom) {
    if (out_of_memory_.load(std::memory_order_relaxed) == oom) return;  // the common case: a plain load
    out_of_memory_.store(oom, std::memory_order_relaxed);
    if (oom) {
      log_.report("Redis is out of memory (maxmemory): scripts refused, /readyz reports not ready");
      schedule_oom_probe();
    }
  }

  void schedule_oom_probe() {
    if (stopping_) return;
    oom_probe_timer_.expires_after(options_.breaker_probe_interval);
    oom_probe_timer_.async_wait(asio::bind_executor(strand_, [self = shared_from_this()](boost::system::error_code ec) {
      if (ec || self->stopping_ || !self->out_of_memory_.load(std::memory_order_relaxed)) return;
      self->conn_->send(detail::oom_probe_command(), &redis_core::on_oom_probe, self.get());
      self->schedule_oom_probe();
    }));
  }

  static void on_oom_probe(redisAsyncContext* ac, void* reply_ptr, void* privdata) {
    auto* self = static_cast<redis_core*>(privdata);
    auto* r = static_cast<redisReply*>(reply_ptr);
    if (r == nullptr || !self->conn_->is_current(ac)) return;
    if (r->type != REDIS_REPLY_ERROR) self->set_out_of_memory(false);
  }

  void do_shutdown() {
    if (stopping_) return;
    stopping_ = true;
    deadline_timer_.cancel();
    breaker_.stop();
    oom_probe_timer_.cancel();
    conn_->close();  // waiting checks complete with "unavailable"
    for (auto& o : inflight_) fail(o, errc::backend_unavailable, "backend is shutting down");
    inflight_.clear();
    unsent_.clear();
  }

  const redis_options options_;
  asio::io_context& io_;
  strand_type strand_;
  asio::steady_timer deadline_timer_;
  asio::steady_timer oom_probe_timer_;
  detail::breaker breaker_;
  std::shared_ptr<detail::connection> conn_;
  std::unique_ptr<memory_backend> local_;
  error_log log_;
  detail::server_clock server_clock_;  // observed on the strand, read by build() on any thread

  // Strand only.
  bool deadline_armed_ = false;
  bool stopping_ = false;
  std::deque<op_ptr> inflight_;  // sent (or waiting in unsent_), in deadline order
  std::vector<op_ptr> unsent_;   // waiting for the host name to resolve

  // Any thread.
  std::atomic<bool> ready_{false};
  std::atomic<bool> out_of_memory_{false};
  std::atomic<std::uint64_t> pending_{0};
  std::atomic<std::uint64_t> checks_{0}, redis_decisions_{0}, timeouts_{0}, unavailable_{0}, protocol_errors_{0},
      overloaded_{0}, fail_open_{0}, fail_closed_{0}, local_fallback_{0}, script_reloads_{0}, connects_{0};
};

class redis_backend_impl final : public redis_backend {
 public:
  // Owns an io_context and its thread.
  explicit redis_backend_impl(std::unique_ptr<asio::io_context> io)
      : owned_io_(std::move(io)), work_(owned_io_->get_executor()) {}
  redis_backend_impl() = default;

  void start(std::shared_ptr<redis_core> core) {
    core_ = std::move(core);
    core_->start();
    if (owned_io_) thread_ = std::thread([io = owned_io_.get()] { io->run(); });
  }

  ~redis_backend_impl() override {
    core_->shutdown();
    if (owned_io_) {
      work_.reset();
      owned_io_->stop();
      thread_.join();
    }
  }

  result<decision> check(const check_request& req) override {
    if (core_->on_io_thread()) {
      return {errc::invalid_argument,
              "check() blocks and was called on the Redis backend's io thread; use async_check"};
    }
    auto p = std::make_shared<std::promise<result<decision>>>();
    auto f = p->get_future();
    core_->async_check(req, this, [p](result<decision> d) { p->set_value(std::move(d)); });
    return f.get();
  }

  void async_check(const check_request& req, check_handler handler) override {
    core_->async_check(req, this, std::move(handler));
  }

  result<prepared_rule_ptr> prepare(const rule& r) override {
    auto p = core_->prepare(r, this);
    if (!p) return p.error();
    return prepared_rule_ptr(std::move(*p));
  }

  bool ready() override { return core_->ready(); }
  void forget_rule(std::string_view rule_name) override { core_->forget_rule(rule_name); }
  redis_backend_stats stats() const override { return core_->stats(); }

  void append_metrics(std::string& out) override {
    const redis_backend_stats st = core_->stats();
    auto metric = [&out](const char* name, const char* type, const char* help, std::uint64_t v) {
      prometheus::family(out, name, type, help);
      prometheus::sample(out, name, v);
    };
    metric("sluice_redis_checks_total", "counter", "Valid checks sent to the Redis backend.", st.checks);
    metric("sluice_redis_decisions_total", "counter", "Checks Redis decided.", st.redis_decisions);
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
  }

 private:
  std::unique_ptr<asio::io_context> owned_io_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  std::shared_ptr<redis_core> core_;
  std::thread thread_;
};

result<detail::endpoint> validate_options(const redis_options& o) {
  if (o.addresses.empty()) return {errc::invalid_argument, "redis addresses must not be empty"};
  auto ep = detail::parse_endpoint(o.addresses.front());
  if (!ep) return ep.error();
  if (o.key_prefix.find_first_of("{}") != std::string::npos) {
    return {errc::invalid_argument, "redis key_prefix must not contain '{' or '}' (they would choose the hash slot)"};
  }
  if (o.key_prefix.size() > 256) return {errc::invalid_argument, "redis key_prefix is longer than 256 bytes"};
  if (o.database < 0) return {errc::invalid_argument, "redis database must be >= 0"};
  if (o.connect_timeout <= std::chrono::milliseconds::zero())
    return {errc::invalid_argument, "redis connect_timeout must be > 0"};
  if (o.command_timeout <= std::chrono::milliseconds::zero())
    return {errc::invalid_argument, "redis command_timeout must be > 0"};
  if (o.max_pending == 0) return {errc::invalid_argument, "redis max_pending must be > 0"};
  if (o.breaker_failure_threshold < 1) return {errc::invalid_argument, "redis breaker_failure_threshold must be >= 1"};
  if (o.breaker_probe_interval <= std::chrono::milliseconds::zero()) {
    return {errc::invalid_argument, "redis breaker_probe_interval must be > 0"};
  }
  // Durations are added to steady_clock::now() in ns: bound them far below overflow.
  constexpr std::chrono::milliseconds max_duration = std::chrono::hours(24);
  if (o.connect_timeout > max_duration || o.command_timeout > max_duration || o.breaker_probe_interval > max_duration ||
      o.error_log_interval > max_duration) {
    return {errc::invalid_argument,
            "redis connect_timeout, command_timeout, breaker_probe_interval and error_log_interval must be <= 24 h"};
  }
  return ep;
}

// The in-process fallback of on_error = local; none otherwise.
result<std::unique_ptr<memory_backend>> make_local(const redis_options& o) {
  if (o.on_error != failure_policy::local) return std::unique_ptr<memory_backend>();
  memory_backend_options m;
  if (o.clock_for_test) m.clock = o.clock_for_test;
  return make_memory_backend(m);
}

}  // namespace

result<std::unique_ptr<redis_backend>> make_redis_backend(const redis_options& options) {
  auto ep = validate_options(options);
  if (!ep) return ep.error();
  auto local = make_local(options);
  if (!local) return local.error();
  auto io = std::make_unique<asio::io_context>(1);
  auto* io_ptr = io.get();
  auto impl = std::make_unique<redis_backend_impl>(std::move(io));
  impl->start(std::make_shared<redis_core>(options, std::move(*ep), *io_ptr, std::move(*local)));
  return std::unique_ptr<redis_backend>(std::move(impl));
}

result<std::unique_ptr<redis_backend>> make_redis_backend(const redis_options& options, asio::io_context& io) {
  auto ep = validate_options(options);
  if (!ep) return ep.error();
  auto local = make_local(options);
  if (!local) return local.error();
  auto impl = std::make_unique<redis_backend_impl>();
  impl->start(std::make_shared<redis_core>(options, std::move(*ep), io, std::move(*local)));
  return std::unique_ptr<redis_backend>(std::move(impl));
}

}  // namespace sluice
