// SPDX-License-Identifier: Apache-2.0
#include "core/log_value.hpp"

#include <cstdio>

namespace sluice {

std::string log_value(std::string_view v) {
  bool plain = !v.empty() && v.size() <= 256;
  for (char c : v) {
    if (c <= 0x20 || c >= 0x7f || c == '"' || c == '=' || c == '\\') plain = false;
  }
  if (plain) return std::string(v);
  std::string out = "\"";
  for (std::size_t i = 0; i < v.size() && i < 256; ++i) {
    unsigned char c = static_cast<unsigned char>(v[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (v.size() > 256) out += "...";
  out += '"';
  return out;
}

}  // namespace sluice
