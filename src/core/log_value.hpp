// SPDX-License-Identifier: Apache-2.0
// Log field values that a hostile key, domain or error text cannot forge fields or lines with.
#pragma once

#include <string>
#include <string_view>

namespace sluice {

/// A log field value: bare when it is a plain token, else quoted with escapes (at most 256 bytes of
/// it), so that a hostile key cannot forge fields or lines.
std::string log_value(std::string_view v);

}  // namespace sluice
