// SPDX-License-Identifier: Apache-2.0
// sluice/prometheus.hpp — the Prometheus text exposition format, the one writer every part of sluice
// that exports metrics uses (sluiced's counters, each backend's, the middleware's).
//
//   std::string out;
//   sluice::prometheus::family(out, "sluice_live_keys", "gauge", "Keys held by the in-process backend.");
//   sluice::prometheus::sample(out, "sluice_live_keys", 12);
//   sluice::prometheus::sample(out, "sluice_evictions_total{rule=\"" + sluice::prometheus::escape_label(r) + "\"}", 3);
//
// Thread-safe: free functions over the caller's string.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace sluice::prometheus {

/// A label value with backslash, double quote and newline escaped, as the text format requires.
std::string escape_label(std::string_view v);

/// "# HELP name help" and "# TYPE name type" lines.
void family(std::string& out, std::string_view name, std::string_view type, std::string_view help);

/// One "name{labels} value" line; `name_and_labels` is written as given.
void sample(std::string& out, std::string_view name_and_labels, std::uint64_t value);
void sample(std::string& out, std::string_view name_and_labels, std::int64_t value);
void sample(std::string& out, std::string_view name_and_labels, double value);

}  // namespace sluice::prometheus
