// SPDX-License-Identifier: Apache-2.0
// tools/sluice/demo.hpp — `sluice demo`: the seed note's r = 5/s, b = 60 walk-through and the "2N
// pitfall" next to a sliding window log, on simulated time.
#pragma once

#include <ostream>

namespace sluice::cli {

int run_demo(std::ostream& out);

}  // namespace sluice::cli
