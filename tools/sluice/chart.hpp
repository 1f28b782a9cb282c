// SPDX-License-Identifier: Apache-2.0
// tools/sluice/chart.hpp — simulations drawn as one SVG: a panel per policy with requests,
// admitted and refused per step, and the remaining budget, over time.
#pragma once

#include <string>
#include <vector>

#include "simulation.hpp"

namespace sluice::cli {

std::string render_svg(const std::vector<simulation>& runs);

}  // namespace sluice::cli
