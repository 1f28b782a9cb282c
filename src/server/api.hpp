// SPDX-License-Identifier: Apache-2.0
// server/api.hpp — the JSON side of sluiced's POST /v1/check: parsing bodies, rendering replies.
//
// Parsing reads the body's shape (known fields of the right types, a rule that exists, the keys it
// takes); the values (key lengths, cost within the rule's capacity) are validated by the backend's
// check, as for every check, and a bad one changes no limiter state. Replies are rendered from a
// `decision` only.
//
//   auto body = sluice::server::parse_check_body(R"({"rule":"api","key":"user:42"})", *rules);  // a rule_set
//   if (auto* e = std::get_if<sluice::server::api_error>(&body)) reply(e->status, render_error(*e));
//   const auto& checks = std::get<sluice::server::check_batch>(body);
//   sluice::check_request req = checks.items[0].request();   // views into checks.items[0]
//
// Thread-safe: free functions over values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "sluice/backend.hpp"
#include "sluice/decision.hpp"
#include "sluice/rule_set.hpp"
#include "sluice/server/config.hpp"
#include "sluice/server/rule_source_status.hpp"

namespace sluice::server {

/// Largest accepted request body; larger bodies get 413.
inline constexpr std::size_t max_body_bytes = 64 * 1024;
/// Most checks in one batch.
inline constexpr std::size_t max_batch_checks = 1000;

/// An error reply: HTTP status, a stable machine code and a message for people.
struct api_error {
  int status = 400;
  std::string code;  ///< invalid_request | unknown_rule | not_found | method_not_allowed | payload_too_large | ...
  std::string message;
};

/// One parsed check, or the error that makes it invalid. Parsing reads the body's shape (fields,
/// types, the rule named and the keys it takes); the backend validates the values (key lengths,
/// cost), as for every check.
struct check_item {
  /// The rule that decides: the one named, or an override's (see rule_resolver).
  const sluice::rule* rule = nullptr;
  /// Its prepared form: what the backend checks.
  const prepared_rule* prepared = nullptr;
  /// The position of the rule named in the rule set (rule_set::position).
  std::size_t rule_index = 0;
  std::string key;
  std::string tenant;
  std::string user;
  std::int64_t cost = 1;
  std::optional<api_error> error;  ///< Set when this item must not reach the backend.

  /// The backend request; views into this item, which must outlive the check.
  check_request request() const noexcept {
    return {.rule = prepared, .key = key, .tenant = tenant, .user = user, .cost = cost};
  }
};

/// A parsed body: one check (`batch == false`, one item, never with an error) or a batch.
struct check_batch {
  bool batch = false;
  std::vector<check_item> items;
};

/// Given an item whose `prepared` is the rule named and whose keys are read, the prepared rule that
/// decides it (an override of its key, tenant or user, or the rule's own).
using rule_resolver = std::function<const prepared_rule&(const check_item&)>;

/// Parses a POST /v1/check body against `rules` (one hash lookup per check). A single check with
/// any problem is an api_error (400 invalid_request, 404 unknown_rule); in a batch each bad item
/// carries its own error. With `resolve`, each item's rule is the one it returns.
std::variant<check_batch, api_error> parse_check_body(std::string_view body, const rule_set& rules,
                                                      const rule_resolver& resolve = {});

/// Parses a POST /v1/reset body: `rule` (default "default") and a single-layer rule's `key`, or a
/// dual-layer rule's `tenant` and, to reset one user's layer, `user`. The item's rule is the one
/// named: an override of a key shares its state (backend::reset).
std::variant<check_item, api_error> parse_reset_body(std::string_view body, const rule_set& rules);

/// `{"allowed":...,"rule":...,"limit":...,"remaining":...,"retry_after_ms":...,"reset_after_ms":...}`
/// plus "layers" and "rejected_by" for dual-layer rules and "source" when not decided by the limiter.
/// `shadow_rejected`: `d` is a shadow rule's refusal, admitted (shadow_admitted), marked
/// "shadow_rejected":true with the refusing layer.
std::string render_decision(const sluice::rule& r, const decision& d, bool shadow_rejected = false);

/// A shadow rule's refusal as its caller gets it: admitted, no wait, the limiter's figures.
decision shadow_admitted(decision d) noexcept;

/// `{"error":{"code":...,"message":...}}`
std::string render_error(const api_error& e);

/// The one mapping from a check's error to its HTTP answer: the caller's fault
/// (condition::invalid_request) 400 invalid_request, a key table full with when_full = "refuse"
/// 429 capacity_exhausted, a backend failure no failure policy answered 503 backend_unavailable,
/// backend_timeout or backend_overloaded.
api_error api_error_of(const error& e);

/// The decision given when limiting is disabled: admitted, full capacity left.
decision disabled_decision(const sluice::rule& r) noexcept;

/// GET /v1/rules: `{"version":...,"rules":[{"name":...,"algorithm":...,<parameters>,"source":...}],
/// "overrides":N,"override_list":[{"rule":...,"key"|"tenant"[,"user"]:...,<limits>,"source":...}],
/// "sources":[...]}`; `origins` is index-aligned with `rules`, `overrides` those in force.
std::string render_rules(const std::vector<rule>& rules, const std::vector<rule_origin>& origins,
                         const std::vector<rule_override>& overrides, std::uint64_t version,
                         const std::vector<rule_source_status>& sources);


}  // namespace sluice::server
