// SPDX-License-Identifier: Apache-2.0
// sluice/dual_layer.hpp — one tenant limit and one user limit checked together, all or nothing.
//
// A check is admitted only when both layers admit, and then both record it; a refusal records in
// neither, so a user refused by their own limit uses none of the tenant's, and a tenant-wide
// refusal uses none of the user's. The decision names the refusing layer and reports
// remaining = min(tenant, user). (ADR-002's dual-layer design.)
//
//   auto dual = sluice::dual_layer::create({.tenant = sluice::sliding_window_policy(1000, 60s),
//                                           .user = sluice::sliding_window_policy(100, 60s)});
//   sluice::decision d = dual->try_acquire(now, 1).value();
//   if (!d.allowed && d.rejected_by == sluice::layer::tenant) ...
//
// This is one tenant and one user; keyed.hpp and the memory backend hold one per (tenant, user).
// Thread-safe: one mutex guards both layers.
#pragma once

#include <cstdint>
#include <mutex>

#include "sluice/clock.hpp"
#include "sluice/decision.hpp"
#include "sluice/error.hpp"
#include "sluice/limiter_state.hpp"
#include "sluice/policy.hpp"

namespace sluice {

class dual_layer {
 public:
  struct options {
    policy tenant;                         ///< The tenant layer. Any algorithm.
    policy user;                           ///< The user layer. Any algorithm.
    sluice::clock* clock = &real_clock();  ///< Default: real_clock().
  };

  static result<dual_layer> create(const options& o);

  /// Moving is not thread-safe.
  dual_layer(dual_layer&& other) noexcept;

  /// Errors: invalid cost for either layer (nothing recorded).
  result<decision> try_acquire(time_point now, std::int64_t cost = 1);
  result<decision> try_acquire(std::int64_t cost = 1) { return try_acquire(clock_->now(), cost); }

 private:
  explicit dual_layer(const options& o);

  const policy tenant_policy_;
  const policy user_policy_;
  const compiled_policy tenant_params_;
  const compiled_policy user_params_;
  std::mutex mutex_;
  limiter_state tenant_;  // guarded by mutex_
  limiter_state user_;    // guarded by mutex_
  sluice::clock* clock_;
};

}  // namespace sluice
