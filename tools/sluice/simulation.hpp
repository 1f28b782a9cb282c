// SPDX-License-Identifier: Apache-2.0
// tools/sluice/simulation.hpp — one policy over a traffic pattern, on simulated time: the project's
// own limiter state machines (limiter_state, the in-process backend's), one key, nothing slept.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sluice/error.hpp"
#include "sluice/policy.hpp"

namespace sluice::cli {

struct step_row {
  std::int64_t start_ns = 0;
  std::int64_t requests = 0;
  std::int64_t admitted = 0;
  std::int64_t refused = 0;
  std::int64_t remaining = 0;  ///< what a check at the step's end would leave (the budget then)
  /// Admitted in the window of `window_ns` ending at the step's end: of the one key, or with many
  /// keys the most any key checked in the step got.
  std::int64_t in_window = 0;
};

struct simulation {
  std::string name;  ///< how the policy is shown: "token_bucket rate=5/s burst=60"
  std::vector<step_row> steps;
  std::int64_t requests = 0, admitted = 0, refused = 0;
  std::int64_t max_admitted_in_window = 0;  ///< the most admitted in any window of `window_ns`
  std::int64_t window_ns = 0;
  std::int64_t capacity = 0;      ///< the policy's limit or burst (0: not known, an observed run)
  std::int64_t window_limit = 0;  ///< what the policy lets through in `window_ns` (0: not known)
};

/// Most steps (table rows) a simulation may have.
inline constexpr std::int64_t max_steps = 1'000'000;

/// Whether steps of `step_ns` over `times` (sorted ns, within traffic's max_span_ns) make at most
/// max_steps rows: simulate's and tally's precondition, for a step the user chose.
result<void> check_steps(const std::vector<std::int64_t>& times, std::int64_t step_ns);

/// "token_bucket rate=5/s burst=60", "sliding_window limit=100 window=60s".
std::string describe(const policy& p);

/// Replays `times` (sorted ns) against `p`, one cost-1 check each, in steps of `step_ns` up to the
/// last request's step (at least `until_ns`). With `keys` (one per request), each key has its own
/// limiter: `remaining` is then the smallest budget of any key seen, and the most admitted in a
/// window the most any one key got. Precondition: validate(p).
simulation simulate(const policy& p, const std::vector<std::int64_t>& times, std::int64_t step_ns,
                    std::int64_t window_ns, std::int64_t until_ns = 0, const std::vector<std::uint32_t>& keys = {});

/// What a service answered to `times` (sorted ns), as a simulation: `admitted[i]` and the
/// `remaining[i]` it reported for request i, the last of each step shown as its budget.
simulation tally(std::string name, const std::vector<std::int64_t>& times, const std::vector<bool>& admitted,
                 const std::vector<std::int64_t>& remaining, std::int64_t step_ns, std::int64_t window_ns);

/// The table and totals as text.
std::string render_table(const simulation& s);

}  // namespace sluice::cli
