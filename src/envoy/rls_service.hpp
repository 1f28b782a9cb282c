// SPDX-License-Identifier: Apache-2.0
// src/envoy/rls_service.hpp — Envoy's ShouldRateLimit, decided on any sluice backend.
//
// A request's descriptors are matched against the domain's limits (rls_rules), each limit that
// applies becomes a check of its rule for the descriptor's values, and the checks are decided in
// one backend::check_all: the request passes only if every one does, and a refused request
// consumes nothing (all_or_nothing; false restores envoyproxy/ratelimit's way, each descriptor
// counted on its own). Descriptors in shadow_mode are checked on their own and never refuse; those
// in quota_mode are checked on their own and refuse only together (every quota descriptor over);
// a descriptor with hits_addend 0 looks at its counters and is over once nothing is left.
// A descriptor's own `limit` (an override) replaces the config's, counted on the same values.
//
//   rls_service rls(backend, {.all_or_nothing = true});
//   rls.set_rules(rls_rules::build(domains, backend, nullptr, rls.counters()).value());
//   rls.decide(request, response, [](grpc::Status s) { ... });  // inline on the memory backend
//
// Thread-safe.
#pragma once

#include <grpcpp/support/status.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "core/published.hpp"
#include "envoy/rls_rules.hpp"
#include "envoy/service/ratelimit/v3/rls.pb.h"
#include "sluice/backend.hpp"
#include "sluice/envoy/options.hpp"

namespace sluice::envoy {

namespace pb = ::envoy::service::ratelimit::v3;

/// Most descriptors in a request, entries in a descriptor, and units one descriptor may take.
inline constexpr int max_descriptors = static_cast<int>(max_checks_per_call);
inline constexpr int max_entries = 32;
inline constexpr std::uint64_t max_hits = UINT32_MAX;
/// Most distinct (domain, unit, requests_per_unit) overrides prepared at once.
inline constexpr std::size_t max_override_limits = 1024;
/// Most distinct unknown domains logged (each once); later ones are only counted.
inline constexpr std::size_t max_logged_unknown_domains = 1024;

class rls_service {
 public:
  using done_handler = std::function<void(grpc::Status)>;

  rls_service(backend& b, rls_options o);
  ~rls_service();

  /// Calls from now on decide with `rules`; calls already deciding keep theirs.
  void set_rules(std::shared_ptr<const rls_rules> rules) { rules_.publish(std::move(rules)); }
  std::shared_ptr<const rls_rules> rules() const { return rules_.load(); }
  counter_registry& counters() noexcept { return counters_; }

  /// Decides `req` into `resp` (both valid until `done` runs), then calls `done`: inline on an
  /// in-process backend, else on the backend's thread. INVALID_ARGUMENT for a malformed request
  /// (nothing counted), UNAVAILABLE when the backend fails without an on_error decision.
  void decide(const pb::RateLimitRequest& req, pb::RateLimitResponse& resp, done_handler done);

  /// Requests by outcome (a domain no config defines is answered OK with no limit, counted as
  /// unknown_domain and logged once), and the descriptors' counters.
  void append_metrics(std::string& prometheus_text) const;

 private:
  struct call;
  struct override_limit;

  // `unit_number`: the request's, any int (proto enums are open).
  std::shared_ptr<const override_limit> override_for(const std::string& domain, std::uint32_t requests_per_unit,
                                                     int unit_number, grpc::Status& status);
  void finish(call& c);
  void note_unknown_domain(const std::string& domain);

  backend& backend_;
  const rls_options options_;
  counter_registry counters_;
  published<rls_rules> rules_{nullptr};
  // Overrides: each (domain, unit) has a base rule holding the state, and each requests_per_unit
  // an override of it over that state (backend::prepare_override). Guarded by mutex_.
  std::mutex mutex_;
  std::map<std::pair<std::string, unit>, prepared_rule_ptr> override_bases_;
  std::map<std::tuple<std::string, unit, std::uint32_t>, std::shared_ptr<const override_limit>> overrides_;
  std::map<std::string, prepared_rule_ptr> deny_rules_;  // requests_per_unit 0, per domain
  std::atomic<std::uint64_t> ok_{0}, over_limit_{0}, invalid_{0}, failed_{0}, unknown_domain_{0};
  std::atomic<std::uint64_t> global_shadow_{0};  // over a limit, answered OK by [envoy] shadow_mode
  std::mutex unknown_mutex_;
  std::set<std::string, std::less<>> unknown_domains_;  // logged; guarded by unknown_mutex_
  bool unknown_domains_full_ = false;                   // guarded by unknown_mutex_
};

}  // namespace sluice::envoy
