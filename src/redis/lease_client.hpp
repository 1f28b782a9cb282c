// SPDX-License-Identifier: Apache-2.0
// src/redis/lease_client.hpp — a Redis backend's leased rules (rule::lease): their lease tables
// (lease_table.hpp), a leased rule's checks answered from them, and the calls that take, refill and
// give back leases, sent through one engine (engine.hpp) and answered back here; every
// lease_sweep_interval, the leases whose period ended are given back.
//
// One per engine; a backend on several io threads uses its leader's for every thread's checks, so a
// rule has one lease table on the instance whichever thread checks it.
//
// Thread-safe where marked; everything else runs on the engine's strand.
#pragma once

#include <atomic>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "redis/command.hpp"
#include "redis/lease_table.hpp"
#include "redis/strand.hpp"
#include "sluice/backend.hpp"
#include "sluice/redis_options.hpp"

struct redisReply;

namespace sluice::detail {

class engine;
struct redis_prepared_rule;
class node;
struct op;
using op_ptr = std::shared_ptr<op>;

/// Most keys of one leased rule holding leases on one instance (the others are checked without).
inline constexpr std::size_t max_leased_keys = 100'000;
/// How often leases whose period ended are given back.
inline constexpr std::chrono::milliseconds lease_sweep_interval{50};

/// A lease's call on its way, and what its reply updates.
struct lease_call {
  enum class kind : std::uint8_t {
    take,        ///< A check that takes a lease.
    refill,      ///< More units for a key, ahead of need (no check waits for it).
    user_layer,  ///< A dual-layer check's user layer, its tenant's unit from a lease.
    give_back,   ///< A lease's unused units back to Redis.
  };
  kind what = kind::take;
  std::shared_ptr<lease_table> table;  // held: a refill or give-back may outlive the rule
  std::string key;                     // the leased layer's key
  std::int64_t cost = 0;               // the check's (0: a refill)
  std::int64_t want = 0;               // take, refill: the most units asked for
  std::int64_t sent_ns = 0;            // local time, taken before it is sent
  decision tenant;                     // user_layer: the tenant layer, from the lease
  lease_reservation reserved;          // user_layer: put back when the user layer refuses or fails

  lease_call(kind k, std::shared_ptr<lease_table> t, std::string_view leased_key, std::int64_t now)
      : what(k), table(std::move(t)), key(leased_key), sent_ns(now) {}
  std::size_t script() const;  // the index of the script it calls
};

class lease_client {
 public:
  /// `through`: the engine its calls go through, which owns it.
  lease_client(engine& through, const strand_type& strand, const redis_options& o);

  /// A new table for a leased rule, registered for the sweeps and metrics. Thread-safe.
  std::shared_ptr<lease_table> add(const rule& r, const prepared_script& call);
  /// A leased rule's check: answered from its key's lease, sent, or left waiting for the call in
  /// flight (which resumes it). Thread-safe.
  void check(const check_request& req, const redis_prepared_rule& p, check_handler handler, bool resumed = false);
  /// A lease call's reply (not an error, not expired) from node `n`.
  void answered(const op_ptr& o, node& n, const redisReply& reply);
  /// A lease call that Redis did not answer (or that could not be sent). Thread-safe.
  void failed(const op_ptr& o);
  /// Gives back the leases whose period ended, and waits (at most the command timeout) until no
  /// lease call is in flight. Not on the engine's io thread (there it only starts it).
  void give_back_leases();
  /// Gives back every lease of a dropped rule's table. Thread-safe.
  void return_leases(std::shared_ptr<lease_table> table);
  /// Appends the per-rule lease counters (sluice_lease_*). Thread-safe.
  void append_metrics(std::string& out) const;
  /// The sweeps end (the engine is stopping: no more give-backs either).
  void stop();

 private:
  std::int64_t local_ns() const;  // the time leases run on: the test clock's, or the steady clock's
  bool send(std::shared_ptr<lease_call> call, command c, const check_request& req, const redis_prepared_rule* rule,
            check_handler handler);
  void call_finished();
  void after_calls(std::function<void()> f);
  void sweep_now(std::function<void()> when_idle);
  void send_give_back(const std::shared_ptr<lease_table>& table, const give_back& g);
  std::vector<std::shared_ptr<lease_table>> live_tables();
  void arm_timer();

  engine& engine_;
  const strand_type strand_;
  const redis_options& options_;  // the engine's
  asio::steady_timer timer_;      // strand only
  bool timer_armed_ = false;      // strand only
  std::vector<std::function<void()>> when_idle_;  // strand only: told once no lease call is in flight

  mutable std::mutex mutex_;
  std::vector<std::weak_ptr<lease_table>> tables_;                                // guarded
  std::map<std::string, std::shared_ptr<lease_counters>, std::less<>> counters_;  // guarded, by rule name
  std::atomic<std::size_t> calls_{0};                                             // in flight
};

}  // namespace sluice::detail
