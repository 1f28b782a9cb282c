// SPDX-License-Identifier: Apache-2.0
// src/redis/lease_table.hpp — one leased rule's leases on this instance (rule::lease): per key, the
// units taken from Redis ahead of its checks, what Redis last refused, and how fast the key is
// checked here.
//
// Logic under locks, no I/O: the Redis engine asks it first for every check of a leased rule, and
// sends what it says to send (lease_client.hpp). Time is passed in, as local ns (the steady clock
// or the test clock); a lease call's time is taken before it is sent, so everything that Redis's
// answer says about later moments ("until the window ends", "until this unit's slot ends") is read
// from an earlier origin here, never a later one, and 0.1% shorter (the clocks' drift).
//
// Why nothing is admitted that the shared state did not grant:
//   - windows: a lease's units were counted in the window when leased and are used only before
//     that window ends, so a window's admissions are at most its count;
//   - token bucket: unit j of a lease is used only before its slot on the bucket's timeline ends
//     (the TAT after it). Every admission then conforms to the GCRA as if made when the unit's slot
//     was taken: in any interval the units used had slots ending inside it or at most one
//     tolerance after, which is what the bucket admits in that interval.
//
// Thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "keyed/siphash.hpp"
#include "redis/command.hpp"
#include "sluice/decision.hpp"
#include "sluice/policy.hpp"

namespace sluice::detail {

/// Counters of one rule name's leases (its overrides' and earlier definitions' too), for /metrics.
struct lease_counters {
  std::atomic<std::uint64_t> checks{0};          ///< Checks of the rule.
  std::atomic<std::uint64_t> redis_calls{0};     ///< Script calls they cost (takes, refills, give-backs...).
  std::atomic<std::uint64_t> local_admits{0};    ///< Admitted from a lease, without a call for the leased layer.
  std::atomic<std::uint64_t> local_refusals{0};  ///< Refused from a remembered refusal, without a call.
  std::atomic<std::uint64_t> leases{0};          ///< Lease calls that leased units.
  std::atomic<std::uint64_t> units_leased{0};    ///< Units they leased.
  std::atomic<std::uint64_t> units_returned{0};  ///< Units given back (Redis took them back).
};

/// A check waiting for the lease call in flight for its key; `failed`: that call failed.
using lease_waiter = std::function<void(bool failed)>;

/// A lease call's answer, with the local time it was made at.
struct lease_grant {
  std::int64_t sent_ns = 0;  ///< Local time the call was made (before Redis ran it).
  std::int64_t used = 0;     ///< Of the units, those the check that called took (its cost; 0: a refill).
  lease_reply reply;
};

/// Units a check took from a key's leases, so that they can be put back (undo).
struct lease_reservation {
  struct part {
    std::uint64_t segment = 0;
    std::int64_t units = 0;
    std::int64_t next_after = 0;  // the segment's next unit after them
  };
  std::array<part, 4> parts{};
  int count = 0;
};

/// What to do with one check.
struct lease_plan {
  enum class step : std::uint8_t {
    admit,   ///< Admitted from the lease (`leased`); a refill may be due.
    refuse,  ///< Refused from the remembered refusal (`leased`).
    take,    ///< Call the lease script for the check, asking for `want` units.
    wait,    ///< A lease call for the key is in flight: the check waits for it (its waiter was taken).
    exact,   ///< Check without a lease (the table is full, or too many wait).
  };
  step what = step::exact;
  decision leased;                ///< admit, refuse: the leased layer's figures.
  std::int64_t want = 0;          ///< take: units to lease (at least the cost).
  std::int64_t refill = 0;        ///< admit: > 0 to lease this many more now, ahead of need.
  lease_reservation reservation;  ///< admit: what it took.
};

/// A lease's unused units to give back.
struct give_back {
  std::string key;  ///< The leased layer's key (the single key, or the tenant).
  std::string token;
  std::int64_t units = 0;
};

class lease_table {
 public:
  /// The leases of `r` (with r.lease set), prepared as `script`; at most `max_keys` keys leased at
  /// once (the others are checked without).
  lease_table(const rule& r, prepared_script script, std::size_t max_keys, std::shared_ptr<lease_counters> counters);

  const rule& definition() const noexcept { return rule_; }
  const prepared_script& script() const noexcept { return script_; }
  /// A dual-layer rule's user layer as a single-layer script (its exact check).
  const prepared_script& user_layer() const noexcept { return user_layer_; }
  lease_counters& counters() const noexcept { return *counters_; }
  /// How long a token bucket's lease holds its slots (lease_command's hold), ns.
  std::int64_t hold_ns() const noexcept { return hold_ns_; }

  /// What to do with a check of `cost` on `key` at `now`. For step::wait it calls `make_waiter`
  /// (under the key's lock: it must not call back) and keeps what it returns. A `resumed` check
  /// (one that waited) is not counted again and never waits twice (step::exact instead).
  lease_plan check(std::string_view key, std::int64_t cost, std::int64_t now,
                   const std::function<lease_waiter()>& make_waiter, bool resumed = false);

  /// A lease call for `key` answered (granted or refused): the key's lease and refusal are
  /// updated. Returns the checks that waited for it, to resume.
  std::vector<lease_waiter> answered(std::string_view key, const lease_grant& g, std::int64_t now);
  /// A lease call for `key` failed. Returns the checks that waited for it.
  std::vector<lease_waiter> failed(std::string_view key);
  /// Puts back what an admitted check took (its user layer refused): where it still can be.
  void undo(std::string_view key, const lease_reservation& r, std::int64_t now);

  /// The leases of keys not checked for a period, to give back (their units left that still
  /// count), and drops the keys idle for two periods.
  std::vector<give_back> expire(std::int64_t now);
  /// Every lease's units left, to give back; the table is empty after (the rule was dropped), but
  /// for the calls still in flight, whose units are to be drained again when they are answered.
  std::vector<give_back> drain(std::int64_t now);
  bool dropped() const noexcept { return dropped_.load(std::memory_order_relaxed); }
  /// Forgets `key`'s leases and remembered refusal, before its shared state is reset
  /// (backend::reset): its next check asks Redis. Units leased are dropped, not given back (the
  /// reset forgets them there). A lease call in flight still brings its units when answered.
  void forget(std::string_view key);

 private:
  struct segment {
    std::uint64_t id = 0;
    std::int64_t units = 0;
    std::int64_t next = 0;         // units used or passed
    std::int64_t valid_until = 0;  // no unit is used (or given back) at or after it: its window's end, its last slot's
    std::int64_t first_end = 0;    // token bucket: unit j's slot ends first_end + j × interval
    std::string token;
  };
  struct entry {
    std::vector<segment> segments;      // at most two: the lease in use and its refill
    std::int64_t shared_remaining = 0;  // the leased layer's remaining, as Redis last answered
    std::int64_t reset_at = 0;          // when it said the layer would be full again
    std::int64_t refused_until = 0;     // Redis refused refused_cost (or more) until then
    std::int64_t refused_cost = 0;
    std::int64_t refill_refused_until = 0;  // a refill was refused: none before then
    bool taking = false;                    // a lease call is in flight
    std::vector<lease_waiter> waiting;
    std::int64_t period_start = 0;  // demand: units checked this period and the one before
    std::int64_t demand = 0;
    std::int64_t last_demand = 0;
    std::int64_t last_seen = 0;
    std::int64_t window_end = 0;  // windows: the end of the last lease's window
  };
  struct shard {
    std::mutex mutex;
    // Keys come from outside: each shard's secret hash key keeps chosen-collision floods out.
    std::unordered_map<std::string, entry, keyed_hash, std::equal_to<>> entries;
  };
  static constexpr std::size_t shard_count = 16;
  static constexpr std::size_t max_waiting = 64;

  shard& shard_of(std::string_view key);
  std::int64_t available(segment& s, std::int64_t now) const;  // skips a token bucket's passed slots
  std::int64_t available(entry& e, std::int64_t now) const;
  decision leased_decision(const entry& e, bool allowed, std::int64_t now) const;
  std::int64_t wanted(const entry& e, std::int64_t cost, std::int64_t now) const;
  void leftovers(const std::string& key, entry& e, std::int64_t now, bool all, std::vector<give_back>& out) const;

  const rule rule_;
  const prepared_script script_;
  prepared_script user_layer_;
  const std::int64_t capacity_;
  const std::int64_t period_ns_;
  const std::int64_t interval_ns_;  // token bucket: ns per unit (0: infinite rate); windows: 0
  const std::int64_t max_units_;    // most units one instance holds for a key
  const std::int64_t hold_ns_;
  const std::size_t max_keys_per_shard_;
  const std::shared_ptr<lease_counters> counters_;
  std::atomic<std::uint64_t> next_segment_{1};
  std::atomic<bool> dropped_{false};
  const keyed_hash shard_hash_;
  std::array<shard, shard_count> shards_;
};

}  // namespace sluice::detail
