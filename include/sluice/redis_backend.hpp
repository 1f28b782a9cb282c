// SPDX-License-Identifier: Apache-2.0
// sluice/redis_backend.hpp — limits shared by every instance through one Redis server.
//
// Each algorithm is one Lua script run atomically by Redis (EVALSHA, reloaded transparently after
// SCRIPT FLUSH or a restart); time comes from the Redis server's TIME, so instances whose clocks
// disagree still share one window. The client does its own I/O on Boost.Asio (TCP, a Unix socket,
// or TLS) and reads replies with hiredis's reader: one connection per io_context, concurrent checks
// pipelined on it, no thread blocked per check; checks that arrive while calls are in flight share
// one call of a batch script (redis_options::max_batch). When Redis cannot answer within
// `command_timeout`, the decision follows `on_error`; a circuit breaker then stops paying the timeout
// and reconnects in the background.
//
//   auto b = sluice::make_redis_backend({.addresses = {"10.0.0.5:6379"}, .password = secret});
//   if (!b) return fail(b.error().message);
//   sluice::rule api_rule{.name = "api", .limit = sluice::sliding_window_policy(100, std::chrono::minutes(1))};
//   sluice::prepared_rule_ptr api = (*b)->prepare(api_rule).value();
//   sluice::result<sluice::decision> d = (*b)->check({.rule = api.get(), .key = "user:42"});
//   (*b)->async_check({.rule = api.get(), .key = "user:42"}, [](sluice::result<sluice::decision> d) { ... });
//
// Redis keys (ids percent-encoded, so `{`, `}`, `:`, `%`, spaces and binary bytes never reach a key
// raw, and no two distinct ids share a key):
//   single-layer rule:  PREFIX{RULE:KEY}:ALG
//   dual-layer rule:    PREFIX{TENANT}:RULE:ALG  and  PREFIX{TENANT}:RULE:user:USER:ALG
// where ALG is tb, swl, swc or fw. The `{...}` hash tag keeps a dual-layer rule's two keys in one
// Redis Cluster slot. Every key carries a TTL: idle state disappears by itself.
//
// Limits of the Redis scripts (their numbers are Lua doubles, exact for integers up to 2^53); a
// check whose rule exceeds them fails with errc::invalid_argument before anything is sent:
//   - token bucket: a rate of at most 1,000,000 per second (an interval of at least 1 µs), or
//     rate::infinite(); the bucket then computes in integer ns exactly as in process (a debt beyond
//     ~104 days, i.e. a very slow refill, is exact to within a few ns);
//   - burst and window limits of at most 2^53;
//   - a window longer than 2^52 µs (~142 years) acts as 2^52 µs; windows are in whole µs (rounded up).
// Durations in redis_options must be at most 24 h.
//
// Leases (rule::lease, off by default): checks of a prepared leased rule are answered from units
// this instance took from Redis ahead of them. When a key's lease is empty, one script call checks
// the request and, when it admits, records up to k units with the rule's own algorithm (a window: k
// more in its count; a token bucket: its TAT k intervals later); the next checks admit from them
// with no call. k follows the key's demand here (about two lease periods' worth once the key is
// busy; at least the cost, at most max_share of the capacity): a new key leases its cost alone,
// which is an exact check, and a busy key's leases double until they match its demand. A busy key
// refills when fewer than half its lease is left. Leased units are used only while they still count
// where they were taken: a window's before that window ends, a token bucket's before each unit's
// slot on the bucket's timeline ends (a lease holds slots up to one period ahead, at most max_share
// of the burst, so that units used evenly over the period never outrun their slots). Redis measures
// how long on its clock and this instance spends it on its own, 0.1% shorter: the guarantee assumes
// the two clocks run within that of each other (NTP keeps them within 0.05%), and does not cover a
// step of Redis's clock. What a key's leases hold once it goes unchecked here for a period is given
// back while that is still exact: a window takes it off the same window's count, a token bucket
// moves its TAT back when nobody took a slot since (x/time/rate's Cancel). A refused key is refused
// here, with no call, for its retry_after (for that cost or more). The sliding window log cannot be
// leased (validate(rule) says so): it would log each unit when leased, not when used.
//
// The guarantee: every unit admitted on any instance was granted by the shared state and is used
// while the algorithm still counts it where it was granted, so what all instances admit is at most
// the limit, as the algorithm defines it, at every moment. Admissions can fall short of the limit
// by what other instances' leases hold (at most max_share of the capacity each) until those are
// used, given back, or end; a remembered refusal can keep a key refused here after another instance
// gave units back, until its retry_after, within the same bound. Decisions carry the usual fields;
// `remaining` is Redis's remaining as of this instance's last call for the key plus what is left of
// its lease. Redis unreachable: leased units are still used (they were granted), then on_error
// decides. A failed give-back loses nothing: its units stay counted until their window ends or
// their slots pass. A dual-layer rule leases its tenant layer and checks its user layer exactly,
// one call per check: the tenant's units are taken with an admitted user layer (in one script), or
// from the lease and put back when the user layer refuses (where that is still exact: a token
// bucket's unit only when no later slot was taken since; otherwise it is lost to this instance,
// never over-admitted). check_all() does not lease. A rule prepared again starts without leases or
// remembered refusals; the dropped one's leases are given back. The counters are in append_metrics (sluice_lease_*, per
// rule name).
//
// Thread-safe. `check()` blocks; never call it on the backend's own io thread (it returns
// errc::invalid_argument there) — use async_check (or sluice/asio.hpp) on that thread. Handlers of
// async_check run on the io thread, or inline: for invalid requests, overload, and the checks of a
// leased rule answered from its lease or a remembered refusal. Destroying the backend completes
// every waiting check first (as failures, decided by on_error); never destroy it from inside one of
// its own handlers.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "sluice/backend.hpp"
#include "sluice/error.hpp"
#include "sluice/redis_options.hpp"

namespace boost::asio {
class io_context;
}

namespace sluice {

/// Counters since the backend was made, for metrics. Monotonic except `pending` and `circuit_open`.
struct redis_backend_stats {
  std::uint64_t checks = 0;              ///< Checks accepted (valid requests).
  std::uint64_t redis_decisions = 0;     ///< Checks Redis decided.
  std::uint64_t calls = 0;               ///< Script calls sent (a batch of checks is one).
  std::uint64_t timeouts = 0;            ///< Checks that got no answer within command_timeout.
  std::uint64_t unavailable = 0;         ///< Checks failed because the connection was down or the circuit open.
  std::uint64_t protocol_errors = 0;     ///< Error replies or malformed replies.
  std::uint64_t overloaded = 0;          ///< Checks refused because max_pending checks were waiting.
  std::uint64_t fail_open = 0;           ///< Failed checks admitted by on_error = allow.
  std::uint64_t fail_closed = 0;         ///< Failed checks refused by on_error = deny.
  std::uint64_t local_fallback = 0;      ///< Failed checks decided in process by on_error = local.
  std::uint64_t script_reloads = 0;      ///< NOSCRIPT replies recovered by sending the script again.
  std::uint64_t connects = 0;            ///< Successful connections (the first one included).
  std::uint64_t circuit_opens = 0;       ///< Times a circuit breaker opened (one per server).
  std::uint64_t redirections = 0;        ///< Cluster: checks sent on by MOVED, ASK or READONLY.
  std::uint64_t retries = 0;             ///< Cluster: checks retried after TRYAGAIN or CLUSTERDOWN.
  std::uint64_t topology_refreshes = 0;  ///< Cluster: slot maps read.
  std::uint64_t masters = 0;             ///< Cluster: masters in the current slot map.
  std::uint64_t master_switches = 0;     ///< Sentinel: times the master moved to another address.
  std::uint64_t pending = 0;             ///< Checks waiting right now.
  bool circuit_open = false;             ///< True while checks to a server (on a cluster: to some master) fail fast.
  bool out_of_memory = false;            ///< Redis refuses scripts over maxmemory (ready() is false).
};

/// The Redis backend; `stats()` is what sluiced exports.
class redis_backend : public backend {
 public:
  virtual redis_backend_stats stats() const = 0;
  /// Gives back now what leases whose period ended did not use (the backend does so by itself
  /// every 50 ms), and returns once no lease call is in flight, or after command_timeout + 1 s.
  /// For tests and orderly handovers; never call it on the backend's io thread (it then returns
  /// at once).
  virtual void give_back_leases() = 0;
};

/// Checks what the Redis scripts can compute exactly (see the limits above): token-bucket rates up
/// to 10^6 per second (or infinite), bursts and limits up to 2^53. Checks of a rule that fails here
/// are refused with this error; configuration loaders call it to refuse such rules up front.
result<void> validate_for_redis(const rule& r);

/// Makes a backend with its own io_context thread. Fails only on invalid options
/// (errc::invalid_argument, naming the option); an unreachable
/// Redis is not an error here (checks follow `on_error` until it answers; `ready()` tells).
result<std::unique_ptr<redis_backend>> make_redis_backend(const redis_options& options);

/// As above, on the caller's io_context (which the caller runs; any number of threads). Destroy the
/// backend outside that io_context's threads while it still runs, or after it has stopped (then the
/// connection is closed on the destroying thread; do not restart the io_context meanwhile).
result<std::unique_ptr<redis_backend>> make_redis_backend(const redis_options& options, boost::asio::io_context& io);

/// As above, on several io_contexts, each run by its own thread (a server's io threads): each gets
/// its own connections, and a check asked on one of those threads is sent, batched and answered
/// there, with no hand-off between threads; checks asked on any other thread go to the first. The
/// first io_context's connections also find the servers for the others (the slot map, the
/// master), and carry every leased rule's calls (one lease table per rule). Errors: as above, and
/// an empty list or a null io_context.
result<std::unique_ptr<redis_backend>> make_redis_backend(const redis_options& options,
                                                          std::span<boost::asio::io_context* const> io_threads);

/// The same limits on a Redis Cluster, discovered from `options.addresses` (seeds: any node of the
/// cluster). Each check goes to the master that owns its keys' slot (a dual-layer rule's two keys
/// share one: the tenant's hash tag), on one pipelined connection per master; redirections (MOVED,
/// ASK), slot migrations (TRYAGAIN) and failovers (CLUSTERDOWN, READONLY, a lost master) are
/// followed within `command_timeout` — what cannot be decided in time follows `on_error`, as on one
/// Redis. `ready()` is true while every slot has a master that answers. Every option means what it
/// means for one Redis; `database` must be 0. Errors: as make_redis_backend.
result<std::unique_ptr<redis_backend>> make_redis_cluster_backend(const redis_options& options);

/// As above, on the caller's io_context (see make_redis_backend).
result<std::unique_ptr<redis_backend>> make_redis_cluster_backend(const redis_options& options,
                                                                  boost::asio::io_context& io);

/// As above, on several io_contexts (see make_redis_backend).
result<std::unique_ptr<redis_backend>> make_redis_cluster_backend(const redis_options& options,
                                                                  std::span<boost::asio::io_context* const> io_threads);

/// The same limits on the master that Redis Sentinel watches under `options.master_name`, found by
/// asking the sentinels at `options.addresses` in turn (with sentinel_username/sentinel_password;
/// username and password are the master's). Its ROLE is confirmed before a check is sent; a
/// failover is followed from the sentinels' +switch-master, and from READONLY, LOADING or a lost
/// connection, within `command_timeout` for what waits, as on one Redis otherwise. Replication is
/// asynchronous: the last checks a master admitted before a failover can be lost with it, so a key
/// may admit up to that many more than its limit once. `ready()` is true while a confirmed master
/// answers. Errors: as make_redis_backend, and an empty master_name.
result<std::unique_ptr<redis_backend>> make_redis_sentinel_backend(const redis_options& options);

/// As above, on the caller's io_context (see make_redis_backend).
result<std::unique_ptr<redis_backend>> make_redis_sentinel_backend(const redis_options& options,
                                                                   boost::asio::io_context& io);

/// As above, on several io_contexts (see make_redis_backend).
result<std::unique_ptr<redis_backend>> make_redis_sentinel_backend(
    const redis_options& options, std::span<boost::asio::io_context* const> io_threads);

}  // namespace sluice
