// sluice/backend.hpp — the one interface every place that keeps limiter state implements.
//
// The in-process backend (memory_backend.hpp), the Redis backend and the Redis Cluster backend all
// answer `check(request) -> result<decision>`, blocking or asynchronously, so surfaces (the HTTP
// middleware, sluiced) do not care which one serves them.
//
//   auto backend = sluice::make_memory_backend({});
//   sluice::check_request req{.rule = api_rule, .key = "user:42"};
//   sluice::result<sluice::decision> d = backend->check(req);
//   backend->async_check(req, [](sluice::result<sluice::decision> d) { ... });
//
// Thread-safe: implementations must accept checks from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

#include "sluice/decision.hpp"
#include "sluice/error.hpp"
#include "sluice/policy.hpp"

namespace sluice {

/// One check. Single-layer rules use `key`; dual-layer rules use `tenant` and `user`.
/// The views must stay valid until the check completes (for async_check, until the callback runs).
struct check_request {
  const sluice::rule* rule = nullptr;
  std::string_view key;
  std::string_view tenant;
  std::string_view user;
  std::int64_t cost = 1;
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

class backend {
 public:
  virtual ~backend() = default;

  /// Checks and, when admitted, records `req.cost`. Blocks at most the backend's timeout.
  virtual result<decision> check(const check_request& req) = 0;

  /// As check(), completing through `handler` (possibly inline, possibly on another thread).
  /// Never blocks the calling thread on I/O.
  virtual void async_check(const check_request& req, check_handler handler) = 0;

  /// True when the backend can currently answer (for readiness probes).
  virtual bool ready() = 0;

  /// Called when a rule's parameters change or it is removed, so state kept for it can be dropped.
  /// Default: nothing.
  virtual void forget_rule(std::string_view /*rule_name*/) {}

  /// Drops state that carries no information any more (full buckets, empty windows), one shard
  /// lock at a time. Backends whose state expires by itself (Redis TTLs) do nothing. Default: nothing.
  virtual void sweep_idle() {}
};

}  // namespace sluice
