// SPDX-License-Identifier: Apache-2.0
// server/log_format.hpp — sluiced's log lines as [log] sets them: text (the line as written:
// `event=... key=value ...`, values quoted by log_value where needed) or JSON (one object per line:
// `time`, `level`, then the same fields in order, a quoted value unquoted), at the level set.
//
//   apply_log_settings({.format = "json", .level = "warn"});
//   spdlog::warn("event=redis_circuit_open address={}", log_value(a));
//   // {"time":"2026-12-05T17:00:00.123Z","level":"warn","event":"redis_circuit_open","address":"..."}
//
// Thread-safe: pure functions; apply_log_settings once at start, before the logger is shared.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sluice/server/config.hpp"

namespace sluice::server {

/// The key=value fields of one line, in order, values unquoted (log_value's \" \\ \xNN undone). A
/// token that is not key=value joins the field "message".
std::vector<std::pair<std::string, std::string>> logfmt_fields(std::string_view line);

/// One JSON object of a line: time, level, then its fields.
std::string json_line(std::string_view time, std::string_view level, std::string_view line);

/// Applies `s` to the default logger: its level and format.
void apply_log_settings(const log_settings& s);

}  // namespace sluice::server
