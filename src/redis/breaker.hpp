// SPDX-License-Identifier: Apache-2.0
// src/redis/breaker.hpp — the Redis backend's circuit breaker.
//
// Closed, checks go to Redis. After `breaker_failure_threshold` consecutive failures (timeouts,
// a lost connection, replies that decide nothing: malformed, or a redirection past max_redirects)
// the owner opens it: checks then follow on_error at once instead of paying the timeout, and every
// `breaker_probe_interval` the breaker calls the owner's probe (which reconnects) until the owner
// closes it on the first answer. A reply that decides a check, error replies included, ends a run
// of failures.
//
//   detail::breaker b(strand, options);
//   if (b.failed(expired) && b.open()) log("circuit open");
//   b.probe_while_open([self] { self->reconnect(); });
//   ... on the handshake's answer: if (b.close()) log("circuit closed");
//
// Not thread-safe, except is_open_now() and opens(): everything else on the strand.
#pragma once

#include <atomic>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>

#include "redis/strand.hpp"
#include "sluice/redis_options.hpp"

namespace sluice::detail {

class breaker {
 public:
  breaker(const strand_type& strand, const redis_options& o)
      : threshold_(o.breaker_failure_threshold),
        probe_interval_(o.breaker_probe_interval),
        strand_(strand),
        probe_timer_(strand) {}

  /// True while open (strand).
  bool is_open() const noexcept { return open_; }
  /// True while open, from any thread.
  bool is_open_now() const noexcept { return open_flag_.load(std::memory_order_relaxed); }
  /// Times it opened, from any thread.
  std::uint64_t opens() const noexcept { return opens_.load(std::memory_order_relaxed); }

  /// Redis answered: the run of consecutive failures ends.
  void succeeded() noexcept { consecutive_failures_ = 0; }
  /// `n` more consecutive failures. True when there were some and the run has reached the threshold.
  bool failed(std::size_t n) noexcept;
  int consecutive_failures() const noexcept { return consecutive_failures_; }

  /// Opens the circuit. True when it was closed (the caller says so in its log).
  bool open() noexcept;
  /// Closes it. True when it was open.
  bool close() noexcept;

  /// While open and not stopped, calls `probe` on the strand every probe interval. At most one
  /// wait is armed: a call while one is armed does nothing. `probe` holds whatever must outlive
  /// the wait (the owner's shared_ptr), as the owner holds this breaker.
  void probe_while_open(std::function<void()> probe);

  /// No probe from now on; cancels the armed wait.
  void stop();

 private:
  const int threshold_;
  const std::chrono::milliseconds probe_interval_;
  strand_type strand_;
  asio::steady_timer probe_timer_;
  int consecutive_failures_ = 0;
  bool open_ = false;
  bool armed_ = false;
  bool stopped_ = false;
  std::atomic<bool> open_flag_{false};
  std::atomic<std::uint64_t> opens_{0};
};

}  // namespace sluice::detail
