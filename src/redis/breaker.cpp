// SPDX-License-Identifier: Apache-2.0
#include "redis/breaker.hpp"

#include <boost/asio/bind_executor.hpp>
#include <utility>

namespace sluice::detail {

bool breaker::failed(std::size_t n) noexcept {
  consecutive_failures_ += static_cast<int>(n);
  return n > 0 && consecutive_failures_ >= threshold_;
}

bool breaker::open() noexcept {
  if (open_) return false;
  open_ = true;
  open_flag_.store(true, std::memory_order_relaxed);
  opens_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool breaker::close() noexcept {
  if (!open_) return false;
  open_ = false;
  open_flag_.store(false, std::memory_order_relaxed);
  return true;
}

void breaker::probe_while_open(std::function<void()> probe) {
  if (armed_ || stopped_) return;
  armed_ = true;
  probe_timer_.expires_after(probe_interval_);
  probe_timer_.async_wait(
      asio::bind_executor(strand_, [this, probe = std::move(probe)](boost::system::error_code) mutable {
        armed_ = false;
        if (stopped_ || !open_) return;
        probe();
        probe_while_open(std::move(probe));
      }));
}

void breaker::stop() {
  stopped_ = true;
  probe_timer_.cancel();
}

}  // namespace sluice::detail
