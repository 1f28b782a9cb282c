// SPDX-License-Identifier: Apache-2.0
// tools/sluice/traffic.hpp — the traffic a simulation replays: request times from a small pattern
// language.
//
//   burst 60 at 0s; 10/s from 0s to 30s; idle 20s; burst 60
//
// Statements are separated by `;` or new lines. A cursor starts at 0s:
//   burst N [at T]        N requests at T (default: the cursor); the cursor moves to T
//   R/s from T1 to T2     R requests a second, evenly spaced, in [T1, T2); the cursor moves to T2
//   R/s for D             the same from the cursor for D
//   idle D                the cursor moves D on
// Times and durations are "250ms", "30s", "5m", "1h". Errors give the line and column.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/error.hpp"

namespace sluice::cli {

/// Most requests a pattern may make.
inline constexpr std::size_t max_requests = 10'000'000;

/// Latest time a pattern may reach, and the longest a CSV's rows may span: 366 days, in ns.
inline constexpr std::int64_t max_span_ns = 366LL * 86'400 * 1'000'000'000;

/// Requests to replay: times in ns from the start, sorted, and for each the key it concerns.
struct traffic {
  std::vector<std::int64_t> times;
  std::int64_t end_ns = 0;  ///< how far the traffic reaches (a pattern's trailing idle)
  std::vector<std::uint32_t> keys;  ///< index into key_names, per request; empty: one key
  std::vector<std::string> key_names;
};

/// Request times in ns from the start, sorted, all of one key. `end_ns`, when given, is set to how
/// far the pattern reaches (past its last request: a trailing `idle` counts).
result<std::vector<std::int64_t>> parse_traffic(std::string_view pattern, std::int64_t* end_ns = nullptr);

/// A CSV of `time[,key]` rows — time in seconds (decimals allowed, e.g. a Unix time from an access
/// log), key any text without a comma — with an optional `time,key` header. Times are taken
/// relative to the earliest. Errors name the row.
result<traffic> parse_csv(std::string_view text);

}  // namespace sluice::cli
