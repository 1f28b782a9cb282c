// SPDX-License-Identifier: Apache-2.0
// tools/sluice/rules_table.hpp — `sluice rules`: sluiced's GET /v1/rules as tables a person reads
// (the rules in force, then the overrides), one row each.
//
//   std::cout << sluice::cli::rules_table(nlohmann::json::parse(body));
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace sluice::cli {

/// The rules and overrides of a /v1/rules body, as aligned columns. Fields it does not know are
/// left out; a body of another shape gives an empty table, never an exception.
std::string rules_table(const nlohmann::json& rules);

}  // namespace sluice::cli
