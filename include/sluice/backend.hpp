// sluice/backend.hpp — the one interface every place that keeps limiter state implements.
//
// The in-process backend (memory_backend.hpp), the Redis backend and the Redis Cluster backend all
// answer `check(request) -> result<decision>`, blocking or asynchronously, so surfaces (the HTTP
// middleware, sluiced) do not care which one serves them.
//
//   std::unique_ptr<sluice::backend> backend = sluice::make_memory_backend({}).value();
//   sluice::check_request req{.rule = api_rule, .key = "user:42"};
//   sluice::result<sluice::decision> d = backend->check(req);
//   backend->async_check(req, [](sluice::result<sluice::decision> d) { ... });
//
// Thread-safe: implementations must accept checks from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sluice/decision.hpp"
#include "sluice/error.hpp"
#include "sluice/policy.hpp"

namespace sluice {

class backend;

/// What a backend made of one rule, once — the memory backend's keyed tables, the Redis backend's
/// script and packed arguments — so that a check of it neither looks the rule up nor validates it
/// again. Made by backend::prepare, immutable, shared by whoever holds it (rule_set, middleware);
/// a memory backend's limiter state lives in it. Valid for checks on the backend that made it.
class prepared_rule {
 public:
  prepared_rule(sluice::rule r, const backend* owner) : rule_(std::move(r)), owner_(owner) {}
  virtual ~prepared_rule() = default;
  prepared_rule(const prepared_rule&) = delete;
  prepared_rule& operator=(const prepared_rule&) = delete;

  const sluice::rule& definition() const noexcept { return rule_; }
  /// The backend that made it: a check on another backend ignores it.
  const backend* owner() const noexcept { return owner_; }

 private:
  sluice::rule rule_;
  const backend* owner_;
};

using prepared_rule_ptr = std::shared_ptr<const prepared_rule>;

/// One check. Single-layer rules use `key`; dual-layer rules use `tenant` and `user`.
/// The views must stay valid until the check completes (for async_check, until the callback runs).
struct check_request {
  const sluice::rule* rule = nullptr;
  std::string_view key;
  std::string_view tenant;
  std::string_view user;
  std::int64_t cost = 1;
  /// The rule as this backend prepared it (with `rule` = &prepared->definition()): the check then
  /// skips the rule's lookup and validation. Must outlive the check. Default: none (the backend
  /// finds, or first makes, what it needs for `rule`: slower).
  const prepared_rule* prepared = nullptr;

  /// A request for `p`'s rule, carrying `p`.
  static check_request of(const prepared_rule& p) noexcept { return {.rule = &p.definition(), .prepared = &p}; }
};

/// Validates a request against its rule: rule set, cost in range, keys present and not too long.
/// Every backend calls this first; a rejected request changes no state.
result<void> validate(const check_request& req);

/// What a remote backend does when it cannot answer (timeout, connection down, circuit open).
enum class failure_policy : std::uint8_t {
  allow,  ///< Fail open: admit, with `decision.source == decision_source::fail_open`. Availability first.
  deny,   ///< Fail closed: refuse, with `decision.source == decision_source::fail_closed`.
  local,  ///< Decide with an in-process limiter of the same rule (best effort, per instance).
};

using check_handler = std::function<void(result<decision>)>;

/// Most checks one check_all() decides together.
inline constexpr std::size_t max_checks_per_call = 64;

/// Validates the checks of one check_all(): 1 to max_checks_per_call of them, each valid as a check
/// (validate) but for a cost above its rule's capacity, single-layer, and no rule and key twice.
result<void> validate_all(std::span<const check_request> checks);

/// Whether `req`'s cost is above what its rule can ever admit (validate_cost's cost_exceeds_burst).
bool exceeds_capacity(const check_request& req) noexcept;

/// The decisions of a check_all(), in the order of its checks.
using check_all_handler = std::function<void(result<std::vector<decision>>)>;

class backend {
 public:
  virtual ~backend() = default;

  /// Validates `r` and makes, once, what checks of it need on this backend. Errors name the bad
  /// parameter, and nothing changes. Default: the rule, validated, and nothing else.
  virtual result<prepared_rule_ptr> prepare(const rule& r);

  /// Prepares `r`, a new definition of `previous`'s rule. When only limits changed (not the
  /// algorithm, window or layers), a backend carries its keys' state over: a window's counts stay
  /// under the new limit, a token bucket keeps its tokens (x/time/rate's SetLimit/SetBurst). The
  /// memory backend does so here; Redis keeps state on the server, which the new parameters read.
  /// Default: prepare(r).
  virtual result<prepared_rule_ptr> prepare_change(const rule& r, const prepared_rule& previous);

  /// Prepares `r`, `base`'s rule with other limits for some of its keys (an override), over the
  /// same state: a key checked with it keeps what it used under `base`, and a tenant's layer stays
  /// one for all its users. The memory backend shares base's tables; Redis keys do not depend on
  /// limits. Default: prepare(r).
  virtual result<prepared_rule_ptr> prepare_override(const rule& r, const prepared_rule& base);

  /// Checks and, when admitted, records `req.cost`. Blocks at most the backend's timeout.
  virtual result<decision> check(const check_request& req) = 0;

  /// As check(), completing through `handler` (possibly inline, possibly on another thread).
  /// Never blocks the calling thread on I/O.
  virtual void async_check(const check_request& req, check_handler handler) = 0;

  /// Decides several single-layer checks as one (an Envoy request's descriptors): when every one
  /// admits, all are recorded; when any refuses, none is, so a refused request consumes nothing.
  /// A check whose cost its rule can never admit (exceeds_capacity) is refused with retry_after
  /// `never`, and the others are then only looked at. Each decision reports its key as it stands
  /// after the call (one that would have admitted but recorded nothing: its unchanged state).
  /// Errors: what validate_all refuses (nothing recorded); a backend failure follows its on_error
  /// for every check. On a Redis Cluster, where one script sees one slot's keys, a call over
  /// several slots first looks at each, and records on each only when all would admit: another
  /// call taking a unit between the two rounds can still leave a refused call recorded in part.
  virtual result<std::vector<decision>> check_all(std::span<const check_request> checks) = 0;

  /// As check_all(), completing through `handler`; `checks` and their views must stay valid until
  /// it runs.
  virtual void async_check_all(std::span<const check_request> checks, check_all_handler handler) = 0;

  /// True when the backend can currently answer (for readiness probes).
  virtual bool ready() = 0;

  /// True when async_check always completes before it returns (an in-process backend): callers
  /// may then skip what waiting on another thread would need. Default: false.
  virtual bool completes_inline() const noexcept { return false; }

  /// Drops the state a backend keeps for checks of `rule_name` made without a prepared rule (a
  /// prepared rule's state goes with the prepared rule). Default: nothing.
  virtual void forget_rule(std::string_view /*rule_name*/) {}

  /// Appends the backend's own metrics to `prometheus_text` (sluice/prometheus.hpp): live keys and
  /// evictions for the memory backend, connection and failure counters for Redis. Default: none.
  virtual void append_metrics(std::string& /*prometheus_text*/) {}

  /// Drops state that carries no information any more (full buckets, empty windows), one shard
  /// lock at a time. Backends whose state expires by itself (Redis TTLs) do nothing. Default: nothing.
  virtual void sweep_idle() {}
};

}  // namespace sluice
