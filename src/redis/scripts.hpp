// SPDX-License-Identifier: Apache-2.0
// src/redis/scripts.hpp — the Lua scripts of the Redis backend and how their arguments are laid out.
//
// Every number a script takes is written in hex digits (Lua's tonumber(s, 16) reads them with
// strtoul, several times cheaper than decimal's strtod). Every script takes
//   ARGV[1] = now in µs, or "-" to read the Redis server's TIME (always "-" outside tests)
//   ARGV[2] = cost
// then the parameters of its algorithm, three numbers each ("params"):
//   token bucket:  interval ns (integer; 0 or >= 1000), tolerance ns (integer, burst × interval), burst
//   windows:       limit, window µs (integer), 0
// Single-layer scripts (KEYS[1], ARGV[3..5]) return {allowed, remaining, retry_after µs, reset_after µs}.
// There is one dual-layer script per (tenant algorithm, user algorithm) pair (KEYS[1] = tenant,
// KEYS[2] = user; ARGV[3..5] tenant params, ARGV[6..8] user params) returning
// each layer's figures as it stands after the check:
// {tenant allowed, remaining, retry µs, reset µs, user allowed, remaining, retry µs, reset µs};
// the check is admitted when both layers admit (see combine_layers). A retry_after of -1 means "never".
// The batch script decides many checks of any rules in one call, the all-or-nothing script the
// checks of one check_all(), the lease scripts take and give back leases (their layouts in
// scripts.cpp).
//
// Thread-safe: constants.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

#include "sluice/policy.hpp"

namespace sluice::detail {

inline constexpr std::size_t algorithm_count = 4;
/// The script that decides many checks in one call (after the 4 single and 16 dual scripts).
inline constexpr std::size_t batch_script = algorithm_count + algorithm_count * algorithm_count;
/// The script that decides the single-layer checks of one check_all() as one.
inline constexpr std::size_t all_script = batch_script + 1;
/// The script that checks a leased single-layer rule and takes its lease (lease.hpp).
inline constexpr std::size_t lease_script = all_script + 1;
/// The same for a dual-layer rule whose tenant layer is leased.
inline constexpr std::size_t lease_dual_script = lease_script + 1;
/// The script that gives a lease's unused units back.
inline constexpr std::size_t give_back_script = lease_dual_script + 1;
/// The script that forgets a key (backend::reset): KEYS[1]; ARGV[1] = now, deadline. Replies
/// {keys deleted, now}.
inline constexpr std::size_t reset_script = give_back_script + 1;
/// 4 single-layer scripts, 16 dual-layer ones, the batch script, the all-or-nothing one, the three
/// of leases and the reset.
inline constexpr std::size_t script_count = reset_script + 1;

struct script {
  std::string name;  ///< For logs and benchmarks: "token_bucket", ..., "dual_layer(sliding_window_log,token_bucket)".
  std::string body;  ///< The Lua source.
  std::string sha1;  ///< Lowercase hex SHA1 of body, as EVALSHA wants it.
};

/// All scripts, indexed as below. Built once.
const std::array<script, script_count>& scripts();

/// The single-layer script of an algorithm.
constexpr std::size_t single_script(algorithm a) noexcept { return static_cast<std::size_t>(a); }

/// The dual-layer script of a (tenant, user) pair of algorithms.
constexpr std::size_t dual_script(algorithm tenant, algorithm user) noexcept {
  return algorithm_count + static_cast<std::size_t>(tenant) * algorithm_count + static_cast<std::size_t>(user);
}

/// Lowercase hex SHA1 of `text`.
std::string sha1_hex(std::string_view text);

}  // namespace sluice::detail
