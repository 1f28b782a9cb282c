// SPDX-License-Identifier: Apache-2.0
// sluice/duration.hpp — durations as configuration files spell them: "250ms", "60s", "5m", "1h", "1d".
//
//   sluice::result<sluice::nanoseconds> w = sluice::parse_duration("30s");
//
// Thread-safe: a pure function.
#pragma once

#include <string_view>

#include "sluice/clock.hpp"
#include "sluice/error.hpp"

namespace sluice {

/// Parses a duration string "<digits><unit>" with unit ms, s, m, h or d ("250ms", "60s", "5m").
/// Anything else (no digits, another unit, spaces, a sign, an overflow) is errc::config_invalid.
result<nanoseconds> parse_duration(std::string_view text);

}  // namespace sluice
