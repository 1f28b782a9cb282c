// SPDX-License-Identifier: Apache-2.0
// sluiced's log lines: field values that a hostile key cannot forge (log_value), and the refusal
// log's budget.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "core/log_value.hpp"  // log_value

namespace sluice::server {

/// `log_rejections`: the first lines of each second are logged in full; the rest are counted per
/// rule and reported once a second by flush(), so a flood of refusals cannot flood the log.
/// Thread-safe.
class rejection_log {
 public:
  /// Refusal lines per second logged in full.
  static constexpr std::size_t lines_per_second = 20;

  /// True when this refusal may be logged in full; otherwise it is counted for `rule`.
  bool admit(std::string_view rule);

  /// Called once a second: logs the counts of what was not logged, and starts a new second.
  void flush();

 private:
  std::mutex mu_;
  std::size_t lines_ = 0;
  std::map<std::string, std::uint64_t, std::less<>> suppressed_;  // rule names come from the config
};

}  // namespace sluice::server
