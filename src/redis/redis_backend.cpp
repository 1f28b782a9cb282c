// The Redis backend: one hiredis connection on an Asio strand, one Lua script per algorithm,
// a deadline per check, a circuit breaker, and the on_error policy.
//
// Everything touching the connection runs on `strand_`. A check is built (keys, arguments) on the
// caller's thread, then posted to the strand, sent (hiredis pipelines it behind the others) and
// completed by the first of: its reply, its deadline, the connection's loss.
#include "sluice/redis_backend.hpp"

#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <charconv>
#include <cstdio>
#include <deque>
#include <future>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>

#include "core/log_throttle.hpp"
#include "redis/asio_hiredis.hpp"
#include "redis/keys.hpp"
#include "redis/scripts.hpp"
#include "sluice/gcra.hpp"
#include "sluice/host_port.hpp"
#include "sluice/memory_backend.hpp"
#include "sluice/prometheus.hpp"

namespace sluice {
namespace {

namespace asio = boost::asio;
using detail::scripts;
using detail::strand_type;
using steady = std::chrono::steady_clock;

struct endpoint {
  std::string host;  // or the unix socket path
  int port = 0;
  bool unix_socket = false;
};

result<endpoint> parse_address(std::string_view a) {
  endpoint e;
  if (a.starts_with("unix:")) {
    e.host = std::string(a.substr(5));
    e.unix_socket = true;
    if (e.host.empty()) return {errc::invalid_argument, "redis address 'unix:' has no path"};
    return e;
  }
  auto hp = parse_host_port(a);
  if (!hp) return {errc::invalid_argument, "redis " + hp.error().message};
  if (hp->port == 0) return {errc::invalid_argument, "redis address '" + std::string(a) + "' has port 0"};
  e.host = std::move(hp->host);
  e.port = hp->port;
  return e;
}

// Appends one RESP bulk string: $len CRLF bytes CRLF.
void bulk(std::string& out, std::string_view s) {
  char len[24];
  auto [end, ec] = std::to_chars(len, len + sizeof len, s.size());
  out += '$';
  out.append(len, end);
  out += "\r\n";
  out += s;
  out += "\r\n";
}

void bulk(std::string& out, std::int64_t v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  bulk(out, std::string_view(buf, static_cast<std::size_t>(end - buf)));
}

// The scripts compute in Lua numbers (doubles): integers are exact up to 2^53, and times in µs since
// the epoch plus a window must stay there. See redis_backend.hpp for the limits this sets.
constexpr std::int64_t max_exact_count = std::int64_t{1} << 53;
constexpr std::int64_t max_window_us = std::int64_t{1} << 52;  // ~142 years
constexpr double max_token_bucket_rate = 1e6;                  // an interval of 1 µs

// What the Redis scripts cannot compute exactly is refused before anything is sent.
result<void> validate_for_redis(const policy& p) {
  if (p.algorithm == algorithm::token_bucket) {
    if (!p.rate.is_infinite() && p.rate.per_second > max_token_bucket_rate) {
      char rate[40];
      std::snprintf(rate, sizeof rate, "%.17g", p.rate.per_second);
      return {errc::invalid_argument, std::string("rate ") + rate +
                                          " per second is above the Redis backend's maximum of 1000000 per second "
                                          "(an interval under 1 µs); use an infinite rate for no limit"};
    }
    if (p.burst > max_exact_count) {
      return {errc::invalid_argument, "burst " + std::to_string(p.burst) + " is above the Redis backend's maximum of 2^53"};
    }
    return {};
  }
  if (p.limit > max_exact_count) {
    return {errc::invalid_argument, "limit " + std::to_string(p.limit) + " is above the Redis backend's maximum of 2^53"};
  }
  return {};
}

// The three script parameters of a policy (see scripts.hpp). Precondition: validate(p) and
// validate_for_redis(p) passed.
void append_params(std::string& out, const policy& p) {
  if (p.algorithm == algorithm::token_bucket) {
    // Integer ns, as in process: interval >= 1000 (or 0: infinite), tolerance <= 2^62.
    gcra_params g = make_gcra_params(p.rate, p.burst);
    bulk(out, g.interval_ns);
    bulk(out, g.tolerance_ns);
    bulk(out, g.burst);
    return;
  }
  // Whole µs, rounded up without overflow (window > 0); longer windows than max_window_us act as it.
  const std::int64_t w = p.window.count();
  const std::int64_t window_us = std::min(max_window_us, w / 1000 + (w % 1000 != 0 ? 1 : 0));
  bulk(out, p.limit);
  bulk(out, window_us);
  bulk(out, "0");
}

nanoseconds from_us(long long us) {
  if (us < 0) return never;
  if (us > std::numeric_limits<std::int64_t>::max() / 1000) return never;
  return nanoseconds(us * 1000);
}

// What a check of one rule sends besides its keys, cost and deadline, made once by prepare():
// the script and the rule's packed parameters; also the rule as the local fallback prepared it.
struct redis_prepared_rule final : prepared_rule {
  redis_prepared_rule(const rule& r, const backend* owner) : prepared_rule(r, owner) {}
  std::size_t script = 0;         // index into scripts()
  bool dual = false;
  std::int64_t limit = 0;         // single: the capacity; dual: the user layer's
  std::int64_t tenant_limit = 0;  // dual only
  std::string params;             // RESP bulk strings: the tenant's then the user's, or the rule's
  prepared_rule_ptr local;        // on_error = local only
};

// One check on its way through the backend.
struct op {
  check_request req;  // views valid until the handler runs
  const redis_prepared_rule* rule = nullptr;  // the caller's (valid as the views), or `made`
  std::shared_ptr<const redis_prepared_rule> made;  // prepared for this check alone
  check_handler handler;
  std::string command;    // RESP: EVALSHA sha numkeys keys... argv..., formatted once
  std::size_t header = 0;  // length of "*argc CRLF"
  std::size_t rest = 0;    // offset of numkeys: what EVAL shares with EVALSHA
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
 public:
  redis_core(const redis_options& o, endpoint ep, asio::io_context& io, std::unique_ptr<memory_backend> local)
      : options_(o),
        endpoint_(std::move(ep)),
        io_(io),
        strand_(asio::make_strand(io)),
        deadline_timer_(strand_),
        probe_timer_(strand_),
        oom_probe_timer_(strand_),
        connect_timer_(strand_),
        local_(std::move(local)),
        log_(o.error_log_interval) {}

  void start() {
    asio::post(strand_, [self = shared_from_this()] { self->connect(); });
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

  // The rule's script and parameters, validated (the rule, and what Redis can compute exactly).
  result<std::shared_ptr<redis_prepared_rule>> prepare_script(const rule& r, const backend* owner) const {
    if (auto v = validate(r); !v) return v.error();
    if (auto v = validate_for_redis(r); !v) return v.error();
    auto p = std::make_shared<redis_prepared_rule>(r, owner);
    p->dual = r.is_dual_layer();
    p->limit = r.limit.capacity();
    p->script = p->dual ? detail::dual_script(r.tenant->algorithm, r.limit.algorithm)
                        : detail::single_script(r.limit.algorithm);
    if (p->dual) {
      p->tenant_limit = r.tenant->capacity();
      append_params(p->params, *r.tenant);
    }
    append_params(p->params, r.limit);
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

  bool ready() const { return ready_.load(std::memory_order_relaxed) && !out_of_memory_.load(std::memory_order_relaxed); }

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
    s.circuit_opens = circuit_opens_.load(std::memory_order_relaxed);
    s.pending = pending_.load(std::memory_order_relaxed);
    s.circuit_open = circuit_open_flag_.load(std::memory_order_relaxed);
    s.out_of_memory = out_of_memory_.load(std::memory_order_relaxed);
    return s;
  }

  void forget_rule(std::string_view name) {
    if (local_) local_->forget_rule(name);
  }

 private:
  // --- building a command (caller's thread) -------------------------------------------------------

  void build(op& o) {
    const redis_prepared_rule& p = *o.rule;
    const rule& r = p.definition();
    const std::int64_t now = options_.clock_for_test ? to_ns(options_.clock_for_test->now()) / 1000 : -1;
    std::string& c = o.command;
    c.reserve(256);
    c += p.dual ? "*14\r\n" : "*10\r\n";
    o.header = c.size();
    bulk(c, "EVALSHA");
    bulk(c, scripts()[p.script].sha1);
    o.rest = c.size();
    if (p.dual) {
      bulk(c, "2");
      bulk(c, detail::tenant_key(options_.key_prefix, r.name, o.req.tenant, r.tenant->algorithm));
      bulk(c, detail::user_key(options_.key_prefix, r.name, o.req.tenant, o.req.user, r.limit.algorithm));
    } else {
      bulk(c, "1");
      bulk(c, detail::single_key(options_.key_prefix, r.name, o.req.key, r.limit.algorithm));
    }
    bulk(c, now);
    bulk(c, o.req.cost);
    c += p.params;
    bulk(c, server_deadline_us());
  }

  // The latest server time (µs) at which this check may still be applied: our own deadline (from
  // now: the op's deadline, set later in submit(), is no earlier) moved to the server's clock by
  // the lower bound of its offset. A call Redis runs later records nothing (see scripts.cpp). -1
  // while no offset is known yet, and with a test clock (its `now` is passed in instead).
  std::int64_t server_deadline_us() const {
    const std::int64_t offset = server_offset_us_.load(std::memory_order_relaxed);
    if (options_.clock_for_test || offset == no_offset) return -1;
    return local_us() + std::chrono::duration_cast<std::chrono::microseconds>(options_.command_timeout).count() + offset;
  }

  static std::int64_t local_us() {
    return std::chrono::duration_cast<std::chrono::microseconds>(steady::now().time_since_epoch()).count();
  }

  // A server time (µs) read by a script or TIME that has just replied: it was read no later than
  // now, so server − now bounds the offset from below. The bound kept is the largest of the last
  // one to two seconds (the tightest, yet following a server clock that is stepped back).
  void observe_server_time(std::int64_t server_us) {
    const std::int64_t now = local_us();
    const std::int64_t sample = server_us - now;
    if (now - offset_epoch_start_us_ > 1'000'000) {
      offset_previous_max_ = offset_current_max_;
      offset_current_max_ = sample;
      offset_epoch_start_us_ = now;
    } else {
      offset_current_max_ = std::max(offset_current_max_, sample);
    }
    server_offset_us_.store(std::max(offset_previous_max_, offset_current_max_), std::memory_order_relaxed);
  }

  // --- on the strand ----------------------------------------------------------------------------

  void submit(op_ptr o) {
    if (stopping_) return fail(o, errc::backend_unavailable, "backend is shutting down");
    if (circuit_open_) return fail(o, errc::backend_unavailable, "circuit open");
    o->deadline = steady::now() + options_.command_timeout;
    if (resolving_) {
      // The host name is being resolved: send once connected, if still within the deadline.
      unsent_.push_back(o);
    } else if (ac_ == nullptr) {
      return fail(o, errc::backend_unavailable, "not connected");
    } else if (!send(o)) {
      return;
    }
    inflight_.push_back(std::move(o));
    arm_deadline();
  }

  bool send(const op_ptr& o) {
    const std::string* command = &o->command;
    std::string eval;
    if (o->resent) {
      // EVAL with the script's body instead of EVALSHA with its hash; the rest is the same.
      const std::string& body = scripts()[o->rule->script].body;
      eval.reserve(o->command.size() + body.size() + 32);
      eval.append(o->command, 0, o->header);
      bulk(eval, "EVAL");
      bulk(eval, body);
      eval.append(o->command, o->rest);
      command = &eval;
    }
    auto* box = new op_ptr(o);
    if (redisAsyncFormattedCommand(ac_, &redis_core::on_reply, box, command->data(), command->size()) != REDIS_OK) {
      delete box;
      fail(o, errc::backend_unavailable, "cannot queue the command on the connection");
      return false;
    }
    return true;
  }

  static void on_reply(redisAsyncContext* ac, void* reply_ptr, void* privdata) {
    op_ptr o = std::move(*static_cast<op_ptr*>(privdata));
    delete static_cast<op_ptr*>(privdata);
    auto* self = static_cast<redis_core*>(ac->data);
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
      if (msg.starts_with("NOSCRIPT") && !o->resent && ac_ != nullptr) {
        // The server forgot the script (SCRIPT FLUSH, restart): send its body; EVAL caches it again.
        o->resent = true;
        script_reloads_.fetch_add(1, std::memory_order_relaxed);
        send(o);
        return;
      }
      consecutive_failures_ = 0;  // Redis answered: the connection is healthy
      if (msg.starts_with("OOM")) set_out_of_memory(true);
      fail(o, errc::backend_protocol, "Redis error: " + std::string(msg.substr(0, 200)));
      return;
    }
    consecutive_failures_ = 0;
    set_out_of_memory(false);
    if (std::int64_t t = reply_time(*reply); t >= 0) observe_server_time(t);
    if (is_expired_reply(*reply)) {
      fail(o, errc::backend_timeout, "the check reached Redis after its deadline; nothing was recorded");
      return;
    }
    auto d = parse(*o, *reply);
    if (!d) {
      fail(o, errc::backend_protocol, d.error().message);
      return;
    }
    redis_decisions_.fetch_add(1, std::memory_order_relaxed);
    complete(o, std::move(d));
    trim_inflight();
  }

  // The server time every script reply ends with (µs, within the 2^53 the scripts compute in), or -1.
  static std::int64_t reply_time(const redisReply& r) {
    if (r.type != REDIS_REPLY_ARRAY || r.elements == 0) return -1;
    const redisReply* last = r.element[r.elements - 1];
    const bool valid = last->type == REDIS_REPLY_INTEGER && last->integer >= 0 && last->integer < (1LL << 53);
    return valid ? last->integer : -1;
  }

  // {-1, now}: the script found its deadline passed and did nothing.
  static bool is_expired_reply(const redisReply& r) {
    return r.type == REDIS_REPLY_ARRAY && r.elements == 2 && r.element[0]->type == REDIS_REPLY_INTEGER &&
           r.element[0]->integer == -1;
  }

  static bool integers(const redisReply& r, std::size_t n, long long* out) {
    if (r.type != REDIS_REPLY_ARRAY || r.elements != n) return false;
    for (std::size_t i = 0; i < n; ++i) {
      if (r.element[i]->type != REDIS_REPLY_INTEGER) return false;
      out[i] = r.element[i]->integer;
    }
    return true;
  }

  // One layer's decision from its four reply values {allowed, remaining, retry µs, reset µs}.
  static decision layer_decision(const long long* v, std::int64_t limit) {
    decision d;
    d.allowed = v[0] == 1;
    d.limit = limit;
    d.remaining = std::max<long long>(0, v[1]);
    d.retry_after = d.allowed ? nanoseconds(0) : from_us(v[2]);
    d.reset_after = from_us(v[3]);  // -1 ("never") only for a bucket that cannot refill
    return d;
  }

  static result<decision> parse(const op& o, const redisReply& r) {
    const redis_prepared_rule& p = *o.rule;
    // Each reply ends with the server time (read by handle_reply).
    if (!p.dual) {
      long long v[5];
      if (!integers(r, 5, v) || (v[0] != 0 && v[0] != 1)) {
        return {errc::backend_protocol, "unexpected reply from the rate-limit script"};
      }
      return layer_decision(v, p.limit);
    }
    long long v[9];
    if (!integers(r, 9, v) || (v[0] != 0 && v[0] != 1) || (v[4] != 0 && v[4] != 1)) {
      return {errc::backend_protocol, "unexpected reply from the dual-layer script"};
    }
    // The same combination as in process.
    return combine_layers(layer_decision(v, p.tenant_limit), layer_decision(v + 4, p.limit));
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
    consecutive_failures_ += static_cast<int>(expired.size());
    const bool trip_now = !expired.empty() && consecutive_failures_ >= options_.breaker_failure_threshold;
    const std::string why = std::to_string(consecutive_failures_) + " consecutive failures";
    // Open the circuit before completing: a caller woken by this timeout already sees it open.
    if (trip_now) open_circuit(why);
    for (const auto& o : expired) fail(o, errc::backend_timeout, "no reply within command_timeout");
    if (trip_now && ac_ != nullptr) drop_connection(why);
    arm_deadline();
  }

  // --- connection and circuit breaker -----------------------------------------------------------

  void connect() {
    if (stopping_ || ac_ != nullptr || resolving_) return;
    if (endpoint_.unix_socket) return connect_to(endpoint_.host);
    boost::system::error_code ec;
    asio::ip::make_address(endpoint_.host, ec);
    if (!ec) return connect_to(endpoint_.host);
    // A host name: resolve without blocking the io thread, then connect to the first address.
    resolving_ = true;
    auto resolver = std::make_shared<asio::ip::tcp::resolver>(strand_);
    resolver->async_resolve(endpoint_.host, std::to_string(endpoint_.port),
                            asio::bind_executor(strand_, [self = shared_from_this(), resolver](
                                                             boost::system::error_code ec2,
                                                             asio::ip::tcp::resolver::results_type results) {
                              self->resolving_ = false;
                              if (self->stopping_) return;
                              if (ec2 || results.empty()) {
                                self->trip("cannot resolve " + self->endpoint_.host + ": " + ec2.message());
                                return;
                              }
                              self->connect_to(results.begin()->endpoint().address().to_string());
                            }));
  }

  void connect_to(const std::string& host) {
    redisAsyncContext* ac =
        endpoint_.unix_socket ? redisAsyncConnectUnix(host.c_str()) : redisAsyncConnect(host.c_str(), endpoint_.port);
    if (ac == nullptr) return trip("cannot allocate a connection");
    if (ac->err) {
      std::string why = "cannot connect to " + address() + ": " + ac->errstr;
      redisAsyncFree(ac);
      return trip(why);
    }
    ac->data = this;
    detail::attach(ac, strand_);
    redisAsyncSetConnectCallback(ac, &redis_core::on_connect);
    redisAsyncSetDisconnectCallback(ac, &redis_core::on_disconnect);
    ac_ = ac;
    ++generation_;
    // The handshake goes first on the connection; checks queued behind it follow in order.
    if (!options_.password.empty()) {
      if (options_.username.empty()) {
        const char* argv[] = {"AUTH", options_.password.c_str()};
        const std::size_t lens[] = {4, options_.password.size()};
        redisAsyncCommandArgv(ac, &redis_core::on_handshake, const_cast<char*>("AUTH"), 2, argv, lens);
      } else {
        const char* argv[] = {"AUTH", options_.username.c_str(), options_.password.c_str()};
        const std::size_t lens[] = {4, options_.username.size(), options_.password.size()};
        redisAsyncCommandArgv(ac, &redis_core::on_handshake, const_cast<char*>("AUTH"), 3, argv, lens);
      }
    }
    if (options_.database != 0) {
      std::string db = std::to_string(options_.database);
      const char* argv[] = {"SELECT", db.c_str()};
      const std::size_t lens[] = {6, db.size()};
      redisAsyncCommandArgv(ac, &redis_core::on_handshake, const_cast<char*>("SELECT"), 2, argv, lens);
    }
    for (const auto& s : scripts()) {
      const char* argv[] = {"SCRIPT", "LOAD", s.body.c_str()};
      const std::size_t lens[] = {6, 4, s.body.size()};
      redisAsyncCommandArgv(ac, &redis_core::on_handshake, const_cast<char*>("SCRIPT LOAD"), 3, argv, lens);
    }
    redisAsyncCommand(ac, &redis_core::on_time, nullptr, "TIME");  // the first clock offset
    redisAsyncCommand(ac, &redis_core::on_handshake, const_cast<char*>("PING"), "PING");
    // Checks that waited for the host name to resolve go right behind the handshake.
    auto waiting = std::move(unsent_);
    unsent_.clear();
    for (auto& o : waiting) {
      if (!o->done) send(o);
    }
    connect_timer_.expires_after(options_.connect_timeout);
    connect_timer_.async_wait(asio::bind_executor(strand_, [self = shared_from_this(), gen = generation_](boost::system::error_code ec) {
      if (ec || self->stopping_ || gen != self->generation_ || self->conn_ready_ || self->ac_ == nullptr) return;
      self->drop_connection("no connection to " + self->address() + " within connect_timeout");
    }));
  }

  static void on_connect(const redisAsyncContext* ac, int status) {
    auto* self = static_cast<redis_core*>(ac->data);
    if (status == REDIS_OK || ac != self->ac_) return;
    // hiredis frees the context after this callback.
    self->ac_ = nullptr;
    self->lost("cannot connect to " + self->address() + ": " + (ac->errstr ? ac->errstr : "error"));
  }

  static void on_disconnect(const redisAsyncContext* ac, int /*status*/) {
    auto* self = static_cast<redis_core*>(ac->data);
    if (ac != self->ac_) return;  // we dropped it ourselves
    self->ac_ = nullptr;
    self->lost("connection to " + self->address() + " lost" + (ac->errstr && ac->err ? std::string(": ") + ac->errstr : ""));
  }

  static void on_time(redisAsyncContext* ac, void* reply_ptr, void*) {
    auto* self = static_cast<redis_core*>(ac->data);
    auto* r = static_cast<redisReply*>(reply_ptr);
    if (r == nullptr || ac != self->ac_ || r->type != REDIS_REPLY_ARRAY || r->elements != 2) return;
    long long sec = 0, usec = 0;
    const redisReply* a = r->element[0];
    const redisReply* b = r->element[1];
    if (a->type != REDIS_REPLY_STRING || b->type != REDIS_REPLY_STRING) return;
    auto [p1, e1] = std::from_chars(a->str, a->str + a->len, sec);
    auto [p2, e2] = std::from_chars(b->str, b->str + b->len, usec);
    if (e1 != std::errc() || e2 != std::errc() || sec < 0 || sec > (1LL << 40) || usec < 0) return;
    self->observe_server_time(sec * 1'000'000 + usec);
  }

  // While Redis refuses scripts for want of memory (OOM), readiness is false, and a probe that is
  // refused the same way (a script that declares writes but makes none) checks every
  // breaker_probe_interval whether memory is back, so readiness returns even with no checks coming.
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
      if (self->ac_ != nullptr) {
        redisAsyncCommand(self->ac_, &redis_core::on_oom_probe, nullptr, "EVAL %s 0", "#!lua\nreturn 1");
      }
      self->schedule_oom_probe();
    }));
  }

  static void on_oom_probe(redisAsyncContext* ac, void* reply_ptr, void*) {
    auto* self = static_cast<redis_core*>(ac->data);
    auto* r = static_cast<redisReply*>(reply_ptr);
    if (r == nullptr || ac != self->ac_) return;
    if (r->type != REDIS_REPLY_ERROR) self->set_out_of_memory(false);
  }

  static void on_handshake(redisAsyncContext* ac, void* reply_ptr, void* privdata) {
    auto* self = static_cast<redis_core*>(ac->data);
    auto* reply = static_cast<redisReply*>(reply_ptr);
    std::string_view step = static_cast<const char*>(privdata);
    if (reply == nullptr || ac != self->ac_ || self->stopping_) return;
    if (reply->type == REDIS_REPLY_ERROR) {
      std::string why = std::string(step) + " failed on " + self->address() + ": " + std::string(reply->str, reply->len);
      // Dropping the context inside its own callback is not allowed: do it next.
      asio::post(self->strand_, [s = self->shared_from_this(), gen = self->generation_, why] {
        if (gen == s->generation_ && s->ac_ != nullptr) s->drop_connection(why);
      });
      return;
    }
    if (step == "PING") self->on_ready();
  }

  void on_ready() {
    conn_ready_ = true;
    ready_.store(true, std::memory_order_relaxed);
    connects_.fetch_add(1, std::memory_order_relaxed);
    consecutive_failures_ = 0;
    connect_timer_.cancel();
    if (circuit_open_) {
      circuit_open_ = false;
      circuit_open_flag_.store(false, std::memory_order_relaxed);
      spdlog::info("sluice redis backend: connected to {}; circuit closed", address());
    }
  }

  // Frees the connection now (not from inside a hiredis callback): its waiting checks fail.
  void drop_connection(const std::string& why) {
    redisAsyncContext* ac = ac_;
    ac_ = nullptr;
    if (ac != nullptr) redisAsyncFree(ac);
    lost(why);
  }

  // The connection is gone (or never came): fail fast until a probe reconnects.
  void lost(const std::string& why) {
    auto waiting = std::move(unsent_);
    unsent_.clear();
    for (auto& o : waiting) fail(o, errc::backend_unavailable, why);
    conn_ready_ = false;
    ready_.store(false, std::memory_order_relaxed);
    if (stopping_) return;
    log_.report(why);
    open_circuit(why);
  }

  // Too many failures while connected: drop the connection (its replies are late or never
  // coming) and fail fast until a probe reconnects.
  void trip(const std::string& why) {
    if (ac_ != nullptr) {
      drop_connection(why);
      return;
    }
    lost(why);
  }

  void open_circuit(const std::string& why) {
    if (!circuit_open_) {
      circuit_open_ = true;
      circuit_open_flag_.store(true, std::memory_order_relaxed);
      circuit_opens_.fetch_add(1, std::memory_order_relaxed);
      spdlog::warn("sluice redis backend: circuit open ({}); checks follow on_error until {} answers", why, address());
    }
    schedule_probe();
  }

  void schedule_probe() {
    if (probe_armed_ || stopping_) return;
    probe_armed_ = true;
    probe_timer_.expires_after(options_.breaker_probe_interval);
    probe_timer_.async_wait(asio::bind_executor(strand_, [self = shared_from_this()](boost::system::error_code) {
      self->probe_armed_ = false;
      if (self->stopping_ || !self->circuit_open_) return;
      // A probe is a new connection; its handshake PING closes the circuit.
      if (self->ac_ == nullptr) self->connect();
      self->schedule_probe();
    }));
  }

  void do_shutdown() {
    if (stopping_) return;
    stopping_ = true;
    deadline_timer_.cancel();
    probe_timer_.cancel();
    oom_probe_timer_.cancel();
    connect_timer_.cancel();
    redisAsyncContext* ac = ac_;
    ac_ = nullptr;
    if (ac != nullptr) redisAsyncFree(ac);  // waiting checks complete with "unavailable"
    for (auto& o : inflight_) fail(o, errc::backend_unavailable, "backend is shutting down");
    inflight_.clear();
    unsent_.clear();
  }

  std::string address() const {
    return endpoint_.unix_socket ? "unix:" + endpoint_.host : endpoint_.host + ":" + std::to_string(endpoint_.port);
  }

  const redis_options options_;
  const endpoint endpoint_;
  asio::io_context& io_;
  strand_type strand_;
  asio::steady_timer deadline_timer_;
  asio::steady_timer probe_timer_;
  asio::steady_timer oom_probe_timer_;
  asio::steady_timer connect_timer_;
  std::unique_ptr<memory_backend> local_;
  error_log log_;

  // Strand only.
  redisAsyncContext* ac_ = nullptr;
  std::uint64_t generation_ = 0;
  bool conn_ready_ = false;
  bool circuit_open_ = false;
  bool resolving_ = false;
  bool deadline_armed_ = false;
  bool probe_armed_ = false;
  bool stopping_ = false;
  int consecutive_failures_ = 0;
  std::int64_t offset_epoch_start_us_ = 0;  // observe_server_time's two epochs
  std::int64_t offset_current_max_ = std::numeric_limits<std::int64_t>::min();
  std::int64_t offset_previous_max_ = std::numeric_limits<std::int64_t>::min();
  std::deque<op_ptr> inflight_;  // sent (or waiting in unsent_), in deadline order
  std::vector<op_ptr> unsent_;    // waiting for the host name to resolve

  // Any thread.
  static constexpr std::int64_t no_offset = std::numeric_limits<std::int64_t>::min();
  std::atomic<bool> ready_{false};
  std::atomic<bool> out_of_memory_{false};
  std::atomic<std::int64_t> server_offset_us_{no_offset};  // server µs − local steady µs, lower bound
  std::atomic<bool> circuit_open_flag_{false};
  std::atomic<std::uint64_t> pending_{0};
  std::atomic<std::uint64_t> checks_{0}, redis_decisions_{0}, timeouts_{0}, unavailable_{0}, protocol_errors_{0},
      overloaded_{0}, fail_open_{0}, fail_closed_{0}, local_fallback_{0}, script_reloads_{0}, connects_{0},
      circuit_opens_{0};
};

class redis_backend_impl final : public redis_backend {
 public:
  // Owns an io_context and its thread.
  explicit redis_backend_impl(std::unique_ptr<asio::io_context> io) : owned_io_(std::move(io)), work_(owned_io_->get_executor()) {}
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
      return {errc::invalid_argument, "check() blocks and was called on the Redis backend's io thread; use async_check"};
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
    metric("sluice_redis_unavailable_total", "counter", "Checks failed: connection down or circuit open.", st.unavailable);
    metric("sluice_redis_protocol_errors_total", "counter", "Error or malformed Redis replies.", st.protocol_errors);
    metric("sluice_redis_overloaded_total", "counter", "Checks refused because max_pending were waiting.", st.overloaded);
    metric("sluice_redis_script_reloads_total", "counter", "NOSCRIPT replies recovered.", st.script_reloads);
    metric("sluice_redis_connects_total", "counter", "Successful Redis connections.", st.connects);
    metric("sluice_redis_circuit_opens_total", "counter", "Times the circuit breaker opened.", st.circuit_opens);
    metric("sluice_redis_pending", "gauge", "Checks waiting on Redis now.", st.pending);
    metric("sluice_redis_circuit_open", "gauge", "1 while checks fail fast.", st.circuit_open ? 1 : 0);
    metric("sluice_redis_out_of_memory", "gauge", "1 while Redis refuses scripts over maxmemory.", st.out_of_memory ? 1 : 0);
  }

 private:
  std::unique_ptr<asio::io_context> owned_io_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  std::shared_ptr<redis_core> core_;
  std::thread thread_;
};

result<endpoint> validate_options(const redis_options& o) {
  if (o.addresses.empty()) return {errc::invalid_argument, "redis addresses must not be empty"};
  auto ep = parse_address(o.addresses.front());
  if (!ep) return ep.error();
  if (o.key_prefix.find_first_of("{}") != std::string::npos) {
    return {errc::invalid_argument, "redis key_prefix must not contain '{' or '}' (they would choose the hash slot)"};
  }
  if (o.key_prefix.size() > 256) return {errc::invalid_argument, "redis key_prefix is longer than 256 bytes"};
  if (o.database < 0) return {errc::invalid_argument, "redis database must be >= 0"};
  if (o.connect_timeout <= std::chrono::milliseconds::zero()) return {errc::invalid_argument, "redis connect_timeout must be > 0"};
  if (o.command_timeout <= std::chrono::milliseconds::zero()) return {errc::invalid_argument, "redis command_timeout must be > 0"};
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

result<void> validate_for_redis(const rule& r) {
  if (auto v = validate_for_redis(r.limit); !v) return {v.error().code, "rule '" + r.name + "': " + v.error().message};
  if (r.tenant) {
    if (auto v = validate_for_redis(*r.tenant); !v) {
      return {v.error().code, "rule '" + r.name + "' tenant layer: " + v.error().message};
    }
  }
  return {};
}

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

result<std::unique_ptr<redis_backend>> make_redis_backend(const redis_options& options, boost::asio::io_context& io) {
  auto ep = validate_options(options);
  if (!ep) return ep.error();
  auto local = make_local(options);
  if (!local) return local.error();
  auto impl = std::make_unique<redis_backend_impl>();
  impl->start(std::make_shared<redis_core>(options, std::move(*ep), io, std::move(*local)));
  return std::unique_ptr<redis_backend>(std::move(impl));
}

}  // namespace sluice
