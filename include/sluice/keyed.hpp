// SPDX-License-Identifier: Apache-2.0
// sluice/keyed.hpp — one limiter per key (user id, tenant, API key, IP) with bounded memory.
//
//   auto users = sluice::keyed_limiter::create({.policy = sluice::token_bucket_policy(sluice::per_second(5), 60),
//                                               .max_keys = 1'000'000});
//   sluice::decision d = (*users)->try_acquire("user:42", now).value();
//
// Keys are any bytes, 1 to max_key_length long. Entries live in a sharded hash table:
//   - an idle entry (a full bucket, an empty window) is dropped as the table grows: a new key would get
//     the same state, so no decision changes;
//   - at most `max_keys` entries; a new key arriving at the cap replaces an idle entry when one is
//     found among 8 sampled. Otherwise `when_full` decides: `evict` (the default) drops the sampled
//     entry that uses the least of its capacity — under a flood of new keys that is a flood key,
//     not a user at their limit — and that key starts afresh; `refuse` refuses the new key
//     (errc::capacity_exhausted) until an entry is idle. stats() counts each outcome.
//   - a token bucket costs 24 bytes per slot, 32 to 64 bytes per key with the table's load factor
//     (keys over 15 bytes add their length); memory_bytes() reports it.
//
// Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "sluice/clock.hpp"
#include "sluice/decision.hpp"
#include "sluice/error.hpp"
#include "sluice/limiter_state.hpp"
#include "sluice/policy.hpp"

namespace sluice {

namespace detail {
struct keyed_unchecked;  // the memory backend's way in, for checks backend::check validated
}

/// What happened at a keyed limiter's key cap since it was made.
struct key_cap_stats {
  std::uint64_t evicted_idle = 0;    ///< Idle entries dropped for new keys: nothing forgotten.
  std::uint64_t evicted_active = 0;  ///< Entries in use dropped for new keys: those keys started afresh.
  std::uint64_t refused = 0;         ///< New keys refused (when_full::refuse).
};

class keyed_limiter {
 public:
  struct options {
    sluice::policy policy;                           ///< The limit every key gets. Required.
    std::size_t max_keys = 1'000'000;                ///< Hard cap on entries; >= 1. Default: 1,000,000.
    sluice::clock* clock = &real_clock();            ///< Read by the overloads without `now`. Default: real_clock().
    sluice::when_full when_full = when_full::evict;  ///< At the cap with nothing idle. Default: evict.
  };

  static result<std::unique_ptr<keyed_limiter>> create(const options& o);

  /// A limiter with policy `p` over `from`'s keys, whose state carries over at `now`: a window's
  /// counts stay (a raised limit raises `remaining` at once, a lowered one forgives nothing), a
  /// token bucket keeps its tokens (x/time/rate's SetLimit/SetBurst). From then on both limiters
  /// use `p`'s parameters; `from` keeps its policy() for what it validates. Errors: an invalid
  /// policy, another algorithm or window.
  static result<std::unique_ptr<keyed_limiter>> retuned(keyed_limiter& from, const sluice::policy& p, time_point now);
  ~keyed_limiter();
  keyed_limiter(const keyed_limiter&) = delete;
  keyed_limiter& operator=(const keyed_limiter&) = delete;

  /// Limits that replace the policy's for the keys checked with them (an override), over the same
  /// state: made by limits_for(), for that limiter and those retuned from it.
  struct key_limits {
    sluice::policy policy;
    compiled_policy compiled;
  };
  /// Errors: an invalid policy, another algorithm or window than this limiter's.
  result<key_limits> limits_for(const sluice::policy& p) const;

  /// Checks `key`'s limiter, under `limits` when given. Errors: empty or over-long key, invalid
  /// cost (nothing recorded).
  result<decision> try_acquire(std::string_view key, time_point now, std::int64_t cost = 1,
                               const key_limits* limits = nullptr);
  result<decision> try_acquire(std::string_view key, std::int64_t cost = 1);

  /// A dual-layer check: `tenants` keyed by tenant, `users` by (tenant, user), all or nothing (see
  /// dual_layer.hpp). `tenants` and `users` must be different limiters.
  static result<decision> try_acquire_dual(keyed_limiter& tenants, std::string_view tenant, keyed_limiter& users,
                                           std::string_view user, time_point now, std::int64_t cost = 1,
                                           const key_limits* tenant_limits = nullptr,
                                           const key_limits* user_limits = nullptr);

  /// One check of try_acquire_all.
  struct keyed_check {
    keyed_limiter* limiter = nullptr;
    std::string_view key;
    std::int64_t cost = 1;
    const key_limits* limits = nullptr;  ///< An override's, or none.
  };
  /// Keys of one or several limiters, all or nothing (backend::check_all): `out[i]` is checks[i]'s
  /// decision, whether it alone would admit; all record only when all would. Every key's shard is
  /// locked at once, in address order. A cost above its limiter's capacity is refused (`never`) and
  /// the call then records nothing. Errors (nothing recorded): an empty or over-long key, a cost
  /// <= 0, `out` of another size, a new key the table refuses (when_full::refuse), or, at the key
  /// cap, new keys of the call evicting one another. No key of one limiter twice, and not the two
  /// limiters of a dual-layer check (try_acquire_dual locks them in its own order).
  static result<void> try_acquire_all(std::span<const keyed_check> checks, time_point now, std::span<decision> out);

  /// Forgets `key` (a reset): its next check finds it full, as a key never seen. False when it held
  /// nothing.
  bool forget(std::string_view key);
  /// As forget() for the users' limiter of a dual-layer check: `user` of `tenant`.
  bool forget_user(std::string_view tenant, std::string_view user);

  const sluice::policy& policy() const noexcept;
  /// Entries held (idle ones included until dropped).
  std::size_t size() const;
  /// Bytes held by the table (see keyed_table.hpp for what is counted).
  std::size_t memory_bytes() const;
  /// Drops every idle entry now.
  void sweep(time_point now);
  key_cap_stats stats() const;

 private:
  friend struct detail::keyed_unchecked;
  struct impl;
  explicit keyed_limiter(std::unique_ptr<impl> p);

  // The three checks above without their validation: the caller has validated key and cost.
  result<decision> acquire(std::string_view key, time_point now, std::int64_t cost, const key_limits* limits);
  static result<decision> acquire_dual(keyed_limiter& tenants, std::string_view tenant, keyed_limiter& users,
                                       std::string_view user, time_point now, std::int64_t cost,
                                       const key_limits* tenant_limits, const key_limits* user_limits);
  static result<void> acquire_all(std::span<const keyed_check> checks, time_point now, std::span<decision> out);

  std::unique_ptr<impl> impl_;
};

}  // namespace sluice
