// SPDX-License-Identifier: Apache-2.0
// src/redis/keys.hpp — Redis key names for (rule, key) and (rule, tenant, user).
//
// Ids come from users. Every id (and the rule name) is percent-encoded: bytes outside printable
// ASCII, space, `{`, `}`, `:` and `%` become %XX. The encoding is injective and leaves no `{`, `}`
// or `:` of the id in the key, so the layouts below parse back unambiguously — no two distinct
// requests share a key, and no id can open, close or choose a hash tag:
//   single-layer:  PREFIX{RULE:KEY}:ALG
//   dual tenant:   PREFIX{TENANT}:RULE:ALG
//   dual user:     PREFIX{TENANT}:RULE:user:USER:ALG
// (a single-layer tag holds one `:`, a dual-layer tag none). ALG names the state: tb2 for a token
// bucket; swl.W, swc2.W or fw2.W for a window of W µs, so that a rule whose window changes starts
// afresh while one whose limit alone changes keeps its keys' state. The 2 marks the binary values
// of the scripts (scripts.cpp): keys in the text form of earlier versions are left to expire, not
// misread, and during a rolling upgrade the two versions count apart.
//
// Thread-safe: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "sluice/policy.hpp"

namespace sluice::detail {

/// Percent-encodes `id` as described above.
std::string encode_id(std::string_view id);

/// ALG for a layer of policy `p`: "tb2", or "swl.W", "swc2.W", "fw2.W".
std::string state_tag(const policy& p);

std::string single_key(std::string_view prefix, std::string_view rule, std::string_view key, std::string_view tag);
std::string tenant_key(std::string_view prefix, std::string_view rule, std::string_view tenant, std::string_view tag);
std::string user_key(std::string_view prefix, std::string_view rule, std::string_view tenant, std::string_view user,
                     std::string_view tag);

}  // namespace sluice::detail
