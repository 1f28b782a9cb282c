// SPDX-License-Identifier: Apache-2.0
// sluice/backend.hpp — the one interface every place that keeps limiter state implements.
//
// The in-process backend (memory_backend.hpp), the Redis backend and the Redis Cluster backend all
// answer `check(request) -> result<decision>`, blocking or asynchronously, so surfaces (the HTTP
// middleware, sluiced) do not care which one serves them.
//
// A rule is prepared once (validated, its limiter state or script made), then every check names the
// prepared rule:
//
//   std::unique_ptr<sluice::backend> backend = sluice::make_memory_backend({}).value();
//   sluice::prepared_rule_ptr api = backend->prepare(api_rule).value();
//   sluice::result<sluice::decision> d = backend->check({.rule = api.get(), .key = "user:42"});
//   backend->async_check({.rule = api.get(), .key = "user:42"}, [](sluice::result<sluice::decision> d) { ... });
//
// The four check calls validate their request (validate, validate_all) and hand it, valid, to the
// implementation's decide*: the one place a request is checked, and below it layers assert.
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
  /// The backend that made it: a check of it on another backend is refused (validate).
  const backend* owner() const noexcept { return owner_; }

 private:
  sluice::rule rule_;
  const backend* owner_;
};

using prepared_rule_ptr = std::shared_ptr<const prepared_rule>;

/// One check of a prepared rule. Single-layer rules use `key`; dual-layer rules use `tenant` and
/// `user`. `rule` was prepared by the backend checked, and it and the views must stay valid until
/// the check completes (for async_check, until the callback runs).
struct check_request {
  const prepared_rule* rule = nullptr;
  std::string_view key;
  std::string_view tenant;
  std::string_view user;
  /// Units the check takes. 0 looks: the decision one unit would get, recording nothing (looked()).
  std::int64_t cost = 1;

  /// The rule's definition. Precondition: `rule` is set.
  const sluice::rule& definition() const noexcept { return rule->definition(); }
};

/// Validates a request for backend `b`: a rule prepared by `b`, cost in range, keys present and not
/// too long. backend::check calls it; a rejected request changes no state.
result<void> validate(const check_request& req, const backend& b);

/// What a remote backend does when it cannot answer (timeout, connection down, circuit open).
enum class failure_policy : std::uint8_t {
  allow,  ///< Fail open: admit, with `decision.source == decision_source::fail_open`. Availability first.
  deny,   ///< Fail closed: refuse, with `decision.source == decision_source::fail_closed`.
  local,  ///< Decide with an in-process limiter of the same rule (best effort, per instance).
};

using check_handler = std::function<void(result<decision>)>;

/// Most checks one check_all() decides together.
inline constexpr std::size_t max_checks_per_call = 64;

/// Validates the checks of one check_all() for backend `b`: 1 to max_checks_per_call of them, each
/// valid as a check (validate) but for a cost above its rule's capacity, single-layer, no look (cost
/// 0), and no rule and key twice.
result<void> validate_all(std::span<const check_request> checks, const backend& b);

/// Whether `req`'s cost is above what its rule can ever admit (validate_cost's cost_exceeds_burst).
bool exceeds_capacity(const check_request& req) noexcept;

/// Validates a reset for backend `b`: a rule prepared by `b`; a single-layer rule's `key`, or a
/// dual-layer rule's `tenant` and, when given, `user`, present and not too long. `cost` is unused.
result<void> validate_reset(const check_request& req, const backend& b);

/// How a reset ends: done, or why not (then nothing is known to have been forgotten).
using reset_handler = std::function<void(result<void>)>;

/// The decisions of a check_all(), in the order of its checks.
using check_all_handler = std::function<void(result<std::vector<decision>>)>;

class backend {
 public:
  virtual ~backend() = default;

  /// What prepare() would refuse `r` for, found without making anything: a config's rules are
  /// checked with it before any is prepared. Default: validate(r).
  virtual result<void> validate_rule(const rule& r) const;

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
  /// Errors: what validate() refuses (nothing changes), a backend failure its on_error turned into
  /// an error.
  result<decision> check(const check_request& req);

  /// As check(), completing through `handler` (possibly inline, possibly on another thread).
  /// Never blocks the calling thread on I/O.
  void async_check(const check_request& req, check_handler handler);

  /// Decides several single-layer checks as one (an Envoy request's descriptors): when every one
  /// admits, all are recorded; when any refuses, none is, so a refused request consumes nothing.
  /// A check whose cost its rule can never admit (exceeds_capacity) is refused with retry_after
  /// `never`, and the others are then only looked at. Each decision reports its key as it stands
  /// after the call (one that would have admitted but recorded nothing: its unchanged state).
  /// Errors: what validate_all refuses (nothing recorded); a backend failure follows its on_error
  /// for every check. On a Redis Cluster, where one script sees one slot's keys, a call over
  /// several slots first looks at each, and records on each only when all would admit: another
  /// call taking a unit between the two rounds can still leave a refused call recorded in part.
  result<std::vector<decision>> check_all(std::span<const check_request> checks);

  /// As check_all(), completing through `handler`; `checks` and their views must stay valid until
  /// it runs.
  void async_check_all(std::span<const check_request> checks, check_all_handler handler);

  /// Forgets what one key has used (after a successful login, or by an operator): its next check
  /// finds it full, as a key never seen. A single-layer rule's `key`; a dual-layer rule's user of
  /// `tenant` (`tenant` and `user`), or with `user` empty the tenant's own layer. An override's
  /// prepared rule resets the same key as its base rule's. Blocks at most the backend's timeout.
  /// Errors: what validate_reset refuses (nothing changes), a backend failure (whatever on_error says:
  /// a reset is never assumed).
  result<void> reset(const check_request& req);

  /// As reset(), completing through `handler` (possibly inline, possibly on another thread).
  void async_reset(const check_request& req, reset_handler handler);

  /// True when the backend can currently answer (for readiness probes).
  virtual bool ready() = 0;

  /// True when async_check always completes before it returns (an in-process backend): callers
  /// may then skip what waiting on another thread would need. Default: false.
  virtual bool completes_inline() const noexcept { return false; }

  /// Appends the backend's own metrics to `prometheus_text` (sluice/prometheus.hpp): live keys and
  /// evictions for the memory backend, connection and failure counters for Redis. Default: none.
  virtual void append_metrics(std::string& /*prometheus_text*/) {}

  /// Drops state that carries no information any more (full buckets, empty windows), one shard
  /// lock at a time. Backends whose state expires by itself (Redis TTLs) do nothing. Default: nothing.
  virtual void sweep_idle() {}

 protected:
  /// The four checks above, given requests their validation accepted (the implementations assert
  /// what it guarantees). Same contracts otherwise.
  virtual result<decision> decide(const check_request& req) = 0;
  virtual void async_decide(const check_request& req, check_handler handler) = 0;
  virtual result<std::vector<decision>> decide_all(std::span<const check_request> checks) = 0;
  virtual void async_decide_all(std::span<const check_request> checks, check_all_handler handler) = 0;

  /// The two resets above, given requests validate_reset accepted. Default: an error saying this
  /// backend keeps no state it can reset.
  virtual result<void> forget(const check_request& req);
  virtual void async_forget(const check_request& req, reset_handler handler);
};

}  // namespace sluice
