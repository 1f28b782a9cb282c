// SPDX-License-Identifier: Apache-2.0
// sluice/memory_backend.hpp — the in-process backend: one limiter per (rule, key), nothing to start.
//
// Keys live in a sharded map per rule with a hard cap on their number (see keyed.hpp for the
// eviction rules). Checks complete inline; async_check calls the handler before it returns.
//
//   auto backend = sluice::make_memory_backend({.max_keys_per_rule = 1'000'000});
//   if (!backend) return fail(backend.error().message);
//   auto api = (*backend)->prepare({.name = "api", .limit = sluice::token_bucket_policy(sluice::per_second(5), 60)});
//   auto d = (*backend)->check({.rule = api->get(), .key = "user:42"});
//
// A prepared rule holds its keys' state: it lives as long as someone holds the prepared rule (a
// rule set, the middleware), and the same rule prepared again starts afresh.
//
// Thread-safe.
#pragma once

#include <cstddef>
#include <memory>

#include <string>
#include <vector>

#include "sluice/backend.hpp"
#include "sluice/clock.hpp"
#include "sluice/error.hpp"
#include "sluice/keyed.hpp"

namespace sluice {

struct memory_backend_options {
  /// Where `now` comes from; not null. Must outlive the backend. Default: real_clock().
  sluice::clock* clock = &real_clock();
  /// Hard cap on live keys per rule (per layer for dual-layer rules); >= 1. Default: 1,000,000.
  std::size_t max_keys_per_rule = 1'000'000;
};

/// One rule's key-cap outcomes (both layers of a dual-layer rule added).
struct rule_key_stats {
  std::string rule;
  key_cap_stats counts;
};

class memory_backend : public backend {
 public:
  /// Number of live keys across all rules (after dropping idle ones lazily).
  virtual std::size_t key_count() = 0;
  /// Key-cap outcomes of each rule checked so far.
  virtual std::vector<rule_key_stats> key_stats() = 0;
};

/// Makes an in-process backend. Fails (errc::invalid_argument, naming the option) on a null clock
/// or max_keys_per_rule = 0; the default options never fail.
result<std::unique_ptr<memory_backend>> make_memory_backend(const memory_backend_options& options);

}  // namespace sluice
