// SPDX-License-Identifier: Apache-2.0
#include "server/log_fields.hpp"

#include <spdlog/spdlog.h>

namespace sluice::server {

bool rejection_log::admit(std::string_view rule) {
  std::lock_guard lock(mu_);
  if (lines_ < lines_per_second) {
    ++lines_;
    return true;
  }
  auto it = suppressed_.find(rule);
  if (it == suppressed_.end()) it = suppressed_.emplace(std::string(rule), 0).first;
  ++it->second;
  return false;
}

void rejection_log::flush() {
  std::map<std::string, std::uint64_t, std::less<>> counts;
  {
    std::lock_guard lock(mu_);
    lines_ = 0;
    counts.swap(suppressed_);
  }
  for (const auto& [rule, n] : counts) {
    spdlog::info("event=rejections_not_logged rule={} count={} interval_ms=1000", rule, n);
  }
}

}  // namespace sluice::server
