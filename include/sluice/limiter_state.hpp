// SPDX-License-Identifier: Apache-2.0
// sluice/limiter_state.hpp — any algorithm's state behind one type, chosen at run time by a policy.
//
// Rules come from configuration, so the memory backend and the dual-layer check hold states whose
// algorithm is known only at run time. `compiled_policy` turns a policy into the integer parameters
// the pure states take; `limiter_state` dispatches to the matching state.
//
//   auto cp = sluice::compiled_policy::from(sluice::sliding_window_policy(100, 60s));
//   sluice::limiter_state s = sluice::limiter_state::make(cp);
//   if (auto d = s.evaluate(cp, now_ns, 1); d.allowed) s.commit(cp, now_ns, 1);
//
// Not thread-safe: callers own the synchronisation.
#pragma once

#include <cstdint>
#include <variant>

#include "sluice/gcra.hpp"
#include "sluice/policy.hpp"
#include "sluice/window_states.hpp"

namespace sluice {

struct compiled_policy {
  sluice::algorithm algorithm = algorithm::token_bucket;
  gcra_params gcra;      ///< token_bucket only
  window_params window;  ///< window algorithms only

  /// Precondition: validate(p) succeeded.
  static compiled_policy from(const policy& p) noexcept;
};

class limiter_state {
 public:
  static limiter_state make(const compiled_policy& p) noexcept;

  decision evaluate(const compiled_policy& p, std::int64_t now, std::int64_t cost);
  void commit(const compiled_policy& p, std::int64_t now, std::int64_t cost);
  std::int64_t idle_at(const compiled_policy& p) const noexcept;
  /// Moves to `to`, of the same algorithm and window as `from`, at `now`: a window's counts carry
  /// over as they are (its limit applies to them from now on), a token bucket keeps its tokens.
  void retune(const compiled_policy& from, const compiled_policy& to, std::int64_t now) noexcept;

 private:
  std::variant<gcra_state, sliding_window_log_state, sliding_window_counter_state, fixed_window_state> state_;
};

/// The one place a check is decided: evaluates, and commits when allowed. A cost of 0 is a look
/// (looked): one unit evaluated, nothing recorded.
template <class State, class Params>
decision check_and_commit(State& s, const Params& p, std::int64_t now, std::int64_t cost) {
  if (cost == 0) return looked(s.evaluate(p, now, 1));
  decision d = s.evaluate(p, now, cost);
  if (d.allowed) s.commit(p, now, cost);
  return d;
}

/// Both layers of a dual-layer check, all or nothing: admitted only when both admit, and then both
/// record; a refusal records in neither, so a user refused by their own limit uses none of the
/// tenant's and vice versa. The caller holds both states' locks. A cost of 0 looks at both layers.
template <class TenantState, class TenantParams, class UserState, class UserParams>
decision check_dual_layer(TenantState& tenant, const TenantParams& tp, UserState& user, const UserParams& up,
                          std::int64_t now, std::int64_t cost) {
  if (cost == 0) return combine_layers(looked(tenant.evaluate(tp, now, 1)), looked(user.evaluate(up, now, 1)));
  decision t = tenant.evaluate(tp, now, cost);
  decision u = user.evaluate(up, now, cost);
  if (t.allowed && u.allowed) {
    tenant.commit(tp, now, cost);
    user.commit(up, now, cost);
  } else {
    // The layer that would have admitted records nothing: it keeps what it had before this check
    // (evaluate reported what would remain after taking `cost`).
    if (t.allowed) t.remaining += cost;
    if (u.allowed) u.remaining += cost;
  }
  return combine_layers(t, u);
}

}  // namespace sluice
