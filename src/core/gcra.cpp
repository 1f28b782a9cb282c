// SPDX-License-Identifier: Apache-2.0
// The GCRA state behind every token bucket (sluice/gcra.hpp): its parameters and retuning.
#include "sluice/gcra.hpp"

#include <algorithm>
#include <cmath>

namespace sluice {

gcra_params make_gcra_params(rate r, std::int64_t burst) noexcept {
  gcra_params p;
  p.burst = burst;
  if (r.is_infinite()) return p;  // interval 0: admit everything
  std::int64_t max_interval = gcra_max_tolerance_ns / std::max<std::int64_t>(burst, 1);
  double interval = r.per_second > 0 ? 1e9 / r.per_second : INFINITY;
  p.interval_ns =
      interval >= static_cast<double>(max_interval) ? max_interval : std::max<std::int64_t>(1, std::llround(interval));
  p.tolerance_ns = p.interval_ns * burst;  // <= gcra_max_tolerance_ns by the clamp above
  return p;
}

namespace {
__extension__ using int128 = __int128;  // products of ns and intervals
}  // namespace

void gcra_state::retune(const gcra_params& from, const gcra_params& to, std::int64_t now) noexcept {
  if (tat <= now || from.interval_ns == 0 || to.interval_ns == 0) {
    tat = empty_tat;
    return;
  }
  // Tokens available now, in ns of the old interval (negative while reservations overdraw), then
  // in ns of the new one, capped by the new burst.
  const int128 available_old = static_cast<int128>(from.tolerance_ns) - (static_cast<int128>(tat) - now);
  const int128 available_new = std::min<int128>(available_old * to.interval_ns / from.interval_ns, to.tolerance_ns);
  const int128 next = static_cast<int128>(now) + (to.tolerance_ns - available_new);
  tat = next > saturating::max ? saturating::max : static_cast<std::int64_t>(next);
}

}  // namespace sluice
