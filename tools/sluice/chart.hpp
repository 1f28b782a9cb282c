// SPDX-License-Identifier: Apache-2.0
// tools/sluice/chart.hpp — one scenario's simulations drawn as one SVG, every policy overlaid in its
// own colour, on three panels sharing the time axis:
//   - admitted in the trailing window, against each policy's limit for that window (dashed): a
//     fixed window's 2N climbs over its line;
//   - requests (grey) and admitted per step;
//   - the budget left, as a share of each policy's capacity.
// Every series is drawn as steps (a value holds over its step); both axes have ticks and gridlines.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "simulation.hpp"

namespace sluice::cli {

struct chart_options {
  /// The seconds shown, [from_ns, to_ns): steps starting outside are left out.
  std::int64_t from_ns = 0;
  std::int64_t to_ns = std::numeric_limits<std::int64_t>::max();
};

/// `runs` share one traffic pattern and one step (as `sluice simulate` makes them).
std::string render_svg(const std::vector<simulation>& runs, const chart_options& options = {});

}  // namespace sluice::cli
