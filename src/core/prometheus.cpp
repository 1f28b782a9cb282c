// SPDX-License-Identifier: Apache-2.0
#include "sluice/prometheus.hpp"

#include <charconv>
#include <cstdio>

namespace sluice::prometheus {

std::string escape_label(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void family(std::string& out, std::string_view name, std::string_view type, std::string_view help) {
  out.append("# HELP ").append(name).append(1, ' ').append(help);
  out.append("\n# TYPE ").append(name).append(1, ' ').append(type).append(1, '\n');
}

void sample(std::string& out, std::string_view name_and_labels, std::uint64_t value) {
  out.append(name_and_labels).append(1, ' ').append(std::to_string(value)).append(1, '\n');
}

void sample(std::string& out, std::string_view name_and_labels, std::int64_t value) {
  out.append(name_and_labels).append(1, ' ').append(std::to_string(value)).append(1, '\n');
}

// The shortest text that reads back as `value` exactly: a start time in seconds since the epoch
// keeps its fraction, where a fixed number of digits would round it to tens of seconds.
void sample(std::string& out, std::string_view name_and_labels, double value) {
  char buf[32];
  const auto end = std::to_chars(buf, buf + sizeof buf, value).ptr;
  out.append(name_and_labels).append(1, ' ').append(buf, end).append(1, '\n');
}

}  // namespace sluice::prometheus
