// SPDX-License-Identifier: Apache-2.0
// src/envoy/domain_config.hpp — envoyproxy/ratelimit's YAML configuration, read as that service
// reads it: one domain per file, nested descriptors, a rate_limit at any level.
//
//   domain: api
//   descriptors:
//     - key: remote_address            # no value: each address its own counter
//       rate_limit: {unit: minute, requests_per_unit: 60}
//     - key: path
//       value: "/login*"               # each '*' matches any run of characters
//       shadow_mode: true
//       rate_limits:                   # sluice: several limits, all or nothing
//         - {unit: second, requests_per_unit: 5, algorithm: token_bucket, burst: 10}
//         - {unit: hour, requests_per_unit: 100, window: 30m}
//
// The sluice keys — `rate_limits`, and `algorithm`, `burst`, `window` on a limit — extend the
// format; a file without them means what it means to envoyproxy/ratelimit, whose keys are all read
// (`metadata`, which only feeds the reference's dynamic metadata, is read and left unused: `ignored`
// says so). Any unknown key, wrong type, duplicate key/value among siblings, impossible value (a
// unit on an unlimited limit, an empty `replaces` name, share_threshold without a wildcard), nesting
// deeper than max_yaml_depth or cycle of `replaces` (a limit replacing itself included: it would
// turn the limits off) is an error starting "file:line: ".
//
// Thread-safe: pure functions over values.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/clock.hpp"
#include "sluice/error.hpp"
#include "sluice/policy.hpp"

namespace sluice::envoy {

/// A limit's unit, numbered as in the protocol (RateLimitResponse.RateLimit.Unit).
enum class unit : std::uint8_t {
  unknown = 0,
  second = 1,
  minute = 2,
  hour = 3,
  day = 4,
  month = 5,
  year = 6,
  week = 7
};

/// The unit's length as envoyproxy/ratelimit counts it: a month is 30 days, a year 365; 0 for unknown.
nanoseconds unit_length(unit u) noexcept;
/// "second", "MINUTE", ... (any case); nullopt for anything else.
std::optional<unit> unit_from_string(std::string_view s) noexcept;
std::string_view to_string(unit u) noexcept;

struct rate_limit_config {
  std::string name;  ///< For `replaces` and for the reply's current_limit.
  envoy::unit unit = unit::unknown;
  std::uint32_t requests_per_unit = 0;
  bool unlimited = false;             ///< Always OK, nothing counted.
  std::vector<std::string> replaces;  ///< Names of limits this one replaces in a request.
  sluice::algorithm algorithm = algorithm::fixed_window;
  std::optional<std::int64_t> burst;  ///< token_bucket: the bucket's size (default: requests_per_unit).
  std::optional<nanoseconds> window;  ///< The window, in place of the unit's length.
  std::string where;                  ///< "file:line", for messages.

  /// The window it counts over: `window`, or the unit's length.
  nanoseconds length() const noexcept { return window ? *window : unit_length(unit); }
  /// The policy it enforces (not for unlimited ones). requests_per_unit 0 refuses everything.
  policy to_policy() const;
};

struct descriptor_config {
  std::string key;
  std::string value;                      ///< Empty: any value, each its own counter; each '*' matches any run.
  std::vector<rate_limit_config> limits;  ///< rate_limit, or rate_limits' list.
  bool shadow_mode = false;               ///< Counted and reported, but always answered OK.
  bool quota_mode = false;                ///< Over its limit, the request is refused only if every quota descriptor is.
  bool detailed_metric = false;           ///< Metrics carry the request's values (bounded in number).
  bool share_threshold = false;           ///< A wildcard value: every value it matches shares one counter.
  bool value_to_metric = false;  ///< Metrics carry the request's value where the config has none or a wildcard.
  std::vector<descriptor_config> descriptors;
  std::string where;
};

struct domain_config {
  std::string domain;
  std::vector<descriptor_config> descriptors;
  std::string file;
  /// What the file sets that sluice reads and leaves unused ("file:line: ..."), for a warning.
  std::vector<std::string> ignored;
};

/// Most bytes of one file, and most descriptors in one domain: a config is data from outside.
inline constexpr std::size_t max_config_file_bytes = 4 << 20;
inline constexpr std::size_t max_descriptors_per_domain = 100'000;
inline constexpr int max_descriptor_depth = 16;
/// Most rate limits and `replaces` entries in one domain, anchors' copies counted each time.
inline constexpr std::size_t max_limits_per_domain = 100'000;
/// Deepest nesting of YAML collections (flow [ { and block), refused before parsing: a real
/// config nests a few levels per descriptor, and yaml-cpp's scanner holds every token of a deeper
/// nesting in memory before its parser refuses it.
inline constexpr int max_yaml_depth = 64;

/// One file's domain. `file` prefixes every error message.
result<domain_config> parse_domain(std::string_view yaml_text, std::string_view file);

/// Every *.yaml and *.yml file of `dir`, in name order, one domain each — or, with `merge`, the
/// descriptors of every file of one domain together (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG).
/// Errors: a file that does not parse (its message), a domain defined by two files without `merge`
/// (naming both), a descriptor two merged files define, an unreadable directory.
result<std::vector<domain_config>> load_domains(const std::filesystem::path& dir, bool merge = false);

}  // namespace sluice::envoy
