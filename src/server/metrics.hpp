// SPDX-License-Identifier: Apache-2.0
// server/metrics.hpp — sluiced's counters and latency histogram, rendered in the Prometheus
// text exposition format (version 0.0.4).
//
// Label values are bounded: rules come from the config, results and layers are fixed sets, and at
// most `max_tenant_labels` distinct tenants get their own label value; later ones count as "other".
//
//   sluice::server::metrics m({.max_tenant_labels = 100});
//   m.record_decision("api", "", d, std::chrono::microseconds(40));
//   std::string text = m.render({.backend_ready = true});   // the backend adds its own (append_metrics)
//
// Thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sluice/decision.hpp"
#include "sluice/error.hpp"

namespace sluice::server {

struct metrics_options {
  /// Distinct tenant label values kept on the rejection counter. Default: 100.
  std::size_t max_tenant_labels = 100;
};

/// Values sampled at render time.
struct metrics_gauges {
  /// Whether the backend answers. Default: true.
  bool backend_ready = true;
  /// The rules in force: each has its counters and histogram, at 0 until it is checked, so that
  /// an idle rule (and instance) appears.
  std::vector<std::string> rules;
};

class metrics {
 public:
  /// Upper bounds of the check latency histogram, in seconds: from 1 µs, below the fastest check
  /// (an in-process one takes a few µs), to 1 s.
  static constexpr std::array<double, 19> latency_buckets{
      0.000001, 0.0000025, 0.000005, 0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001,
      0.0025,   0.005,     0.01,     0.025,   0.05,     0.1,     0.25,   0.5,     1};

  explicit metrics(const metrics_options& options);

  /// A check answered with a decision (by the limiter or a failure policy) after `latency`.
  /// `tenant` is the tenant id of a dual-layer check, else empty.
  /// A `shadow` rule's refusal counts as `shadow_rejected`: admitted, and not among the rejections.
  void record_decision(std::string_view rule, std::string_view tenant, const decision& d, nanoseconds latency,
                       bool shadow = false);

  /// A look (a check of cost 0) answered after `latency`: counted apart, as it decides nothing.
  void record_look(std::string_view rule, nanoseconds latency);

  /// A reset (POST /v1/reset) that forgot its key (`done`) or failed.
  void record_reset(std::string_view rule, bool done);

  /// A check that failed with a backend error no failure policy answered.
  void record_backend_error(std::string_view rule, const error& e, nanoseconds latency);

  /// A config reload attempt.
  void record_reload(bool succeeded);
  /// Config reloads that failed so far.
  std::uint64_t reload_failures() const noexcept { return reloads_failed_.load(std::memory_order_relaxed); }

  /// An HTTP response with `status`.
  void record_response(int status);

  /// The whole exposition.
  std::string render(const metrics_gauges& gauges) const;

 private:
  struct histogram {
    std::array<std::uint64_t, latency_buckets.size()> buckets{};
    std::uint64_t count = 0;
    double sum = 0;
  };
  // Everything counted for one rule; one map lookup per check, no allocation once a rule is known.
  struct rule_stats {
    std::uint64_t allowed = 0;
    std::uint64_t rejected = 0;
    std::uint64_t looked = 0;
    std::uint64_t shadow_rejected = 0;
    std::uint64_t resets = 0;
    std::uint64_t resets_failed = 0;
    std::uint64_t errors = 0;
    histogram latency;
    std::map<std::pair<layer, std::string>, std::uint64_t> rejections;  // layer (none: single), tenant
    std::map<decision_source, std::uint64_t> sources;                   // not decided by the limiter
    std::map<std::string, std::uint64_t> backend_errors;                // error message of the code
  };
  // Counters are kept in shards, one per recording thread (up to shard_count), each with its own
  // mutex, so io threads never contend or bounce a cache line; render() sums the shards.
  static constexpr std::size_t shard_count = 16;
  struct shard {
    std::mutex mu;
    std::map<std::string, rule_stats, std::less<>> rules;
  };
  shard& my_shard();
  static rule_stats& stats_for(shard& s, std::string_view rule);
  std::string tenant_label(std::string_view tenant);

  metrics_options options_;
  mutable std::array<shard, shard_count> shards_;
  std::mutex tenants_mu_;  // only taken for dual-layer refusals
  std::set<std::string, std::less<>> tenants_;
  std::atomic<std::uint64_t> reloads_ok_{0};
  std::atomic<std::uint64_t> reloads_failed_{0};
  std::array<std::atomic<std::uint64_t>, 600> responses_{};  // by status code, lock-free
};

}  // namespace sluice::server
