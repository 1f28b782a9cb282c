// SPDX-License-Identifier: Apache-2.0
// sluice/decision.hpp — the one answer every limiter and backend gives.
//
// A decision carries everything the HTTP headers and the JSON API need: whether the request is
// admitted, the limit, what remains, how long until the same cost would be admitted, and how long
// until the limiter is back to its full, idle state. Dual-layer checks also carry each layer's
// values and the layer that refused.
//
//   sluice::decision d = bucket.try_acquire(now, 1).value();
//   if (!d.allowed) reply_429(d.retry_after);
//
// Not thread-safe to mutate; a plain value.
#pragma once

#include <cstdint>
#include <string_view>

#include "sluice/clock.hpp"

namespace sluice {

/// The layer of a dual-layer check.
enum class layer : std::uint8_t { none, tenant, user };

/// Why the decision is what it is.
enum class decision_source : std::uint8_t {
  limiter,         ///< The limiter decided.
  fail_open,       ///< The backend failed and `on_error = allow` admitted the request.
  fail_closed,     ///< The backend failed and `on_error = deny` refused the request.
  local_fallback,  ///< The backend failed and the in-process limiter decided (`on_error = local`).
  disabled,        ///< Limiting is switched off (`enabled = false`): everything is admitted.
};

/// One layer's figures in a dual-layer decision.
struct layer_figures {
  std::int64_t limit = 0;
  std::int64_t remaining = 0;
};

struct [[nodiscard]] decision {
  bool allowed = false;
  std::int64_t limit = 0;      ///< Capacity: burst for a token bucket, N for windows.
  std::int64_t remaining = 0;  ///< Whole units left after this check; never negative.
  nanoseconds retry_after{0};  ///< 0 when admitted; else how long until the same cost is admitted.
  nanoseconds reset_after{0};  ///< How long until the limiter is back to full (idle) state.

  // Dual-layer checks only (`dual_layer == true`); `remaining` is then min(tenant, user).
  bool dual_layer = false;
  layer rejected_by = layer::none;  ///< The refusing layer (tenant when both refuse).
  layer binding = layer::none;      ///< The layer whose figures `limit` and `remaining` report.
  layer_figures tenant;
  layer_figures user;

  decision_source source = decision_source::limiter;
};

/// A retry_after meaning "never": the request can never be admitted at the current parameters
/// (a bucket with burst 0, or a rate of 0 once the initial burst is spent).
inline constexpr nanoseconds never = nanoseconds::max();

/// The dual-layer decision made of each layer's own decision, as each stands after the check (a layer
/// that would have admitted but recorded nothing because the other refused reports its unchanged
/// state). Admitted only when both admitted. The binding layer is the refusing one, else the one
/// with less remaining; `limit` is its limit, `remaining` the smaller of the two, `retry_after` the
/// longest of the refusing layers', `reset_after` the longer of the two. Every dual-layer check, in
/// process or on Redis, builds its answer here.
decision combine_layers(const decision& tenant, const decision& user) noexcept;

/// A look's answer (a check of cost 0: it records nothing) made of the decision one unit would get:
/// admitted when one unit would be, with its retry_after otherwise, and `remaining` what is left now,
/// before that unit (capped by the limit: an unlimited bucket reports its burst). `reset_after` is
/// as that unit would leave the key when it would be admitted (the same for a fixed window).
/// Applies to each layer of a dual-layer decision as it does to the decision.
decision looked(decision one_unit) noexcept;

std::string_view to_string(layer l) noexcept;
std::string_view to_string(decision_source s) noexcept;

}  // namespace sluice
