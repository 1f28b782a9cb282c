// SPDX-License-Identifier: Apache-2.0
#include "sluice/clock.hpp"

#include <time.h>

#include <condition_variable>
#include <mutex>

namespace sluice {
namespace {

// Sleeps on steady_clock, waking early only when `stop` is requested.
bool sleep_on_steady_clock(time_point deadline, std::stop_token stop) {
  std::mutex mu;
  std::condition_variable_any cv;
  std::unique_lock lock(mu);
  cv.wait_until(lock, stop, deadline, [] { return false; });
  return !stop.stop_requested();
}

class monotonic_clock final : public clock {
 public:
  time_point now() noexcept override { return std::chrono::steady_clock::now(); }
  bool sleep_until(time_point deadline, std::stop_token stop) override {
    return sleep_on_steady_clock(deadline, std::move(stop));
  }
};

class monotonic_coarse_clock final : public clock {
 public:
  time_point now() noexcept override {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return time_point(std::chrono::seconds(ts.tv_sec) + nanoseconds(ts.tv_nsec));
  }
  bool sleep_until(time_point deadline, std::stop_token stop) override {
    // The coarse clock lags steady_clock by up to its resolution; sleeping that much longer on
    // steady_clock guarantees the coarse clock has reached the deadline on waking.
    return sleep_on_steady_clock(deadline + coarse_clock_resolution(), std::move(stop));
  }
};

// CLOCK_MONOTONIC plus the offset to CLOCK_REALTIME read once: it ticks (and sleeps) as the
// monotonic clock, from the Unix epoch.
class unix_epoch_monotonic_clock final : public clock {
 public:
  unix_epoch_monotonic_clock()
      : offset_(std::chrono::duration_cast<nanoseconds>(std::chrono::system_clock::now().time_since_epoch()) -
                std::chrono::steady_clock::now().time_since_epoch()) {}
  time_point now() noexcept override { return std::chrono::steady_clock::now() + offset_; }
  bool sleep_until(time_point deadline, std::stop_token stop) override {
    return sleep_on_steady_clock(deadline - offset_, std::move(stop));
  }

 private:
  const nanoseconds offset_;
};

}  // namespace

clock& unix_epoch_clock() noexcept {
  static auto* instance = new unix_epoch_monotonic_clock;
  return *instance;
}

clock& real_clock() noexcept {
  static auto* instance = new monotonic_clock;  // never destroyed: usable during static destruction
  return *instance;
}

clock& coarse_clock() noexcept {
  static auto* instance = new monotonic_coarse_clock;
  return *instance;
}

nanoseconds coarse_clock_resolution() noexcept {
  timespec ts{};
  clock_getres(CLOCK_MONOTONIC_COARSE, &ts);
  return std::chrono::seconds(ts.tv_sec) + nanoseconds(ts.tv_nsec);
}

}  // namespace sluice
