// SPDX-License-Identifier: Apache-2.0
// src/core/log_throttle.hpp (private) — for log lines that may repeat at a high rate (accept
// failures, handler exceptions, backend errors): the first occurrence is logged at once, then at
// most one a period, carrying the count of those not logged.
//
//   log_throttle throttle{std::chrono::seconds(10)};
//   if (std::uint64_t n = throttle.occurred()) log("accept failed ({} times)", n);
//
// Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <utility>

namespace sluice::detail {

class log_throttle {
 public:
  explicit log_throttle(std::chrono::milliseconds period) : period_(period) {}

  /// Counts one occurrence. Returns how many to report now (this one included), or 0 when the
  /// line waits for the next period.
  std::uint64_t occurred() {
    std::lock_guard lock(mu_);
    ++count_;
    const auto now = std::chrono::steady_clock::now();
    if (logged_ && now - last_ < period_) return 0;
    logged_ = true;
    last_ = now;
    return std::exchange(count_, 0);
  }

 private:
  std::mutex mu_;
  const std::chrono::milliseconds period_;
  std::chrono::steady_clock::time_point last_{};
  std::uint64_t count_ = 0;
  bool logged_ = false;
};

}  // namespace sluice::detail
