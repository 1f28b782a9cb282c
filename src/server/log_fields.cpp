#include "server/log_fields.hpp"

#include <cstdio>

#include <spdlog/spdlog.h>

namespace sluice::server {

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

bool rejection_log::admit(std::string_view rule) {
  std::lock_guard lock(mu_);
  if (lines_ < lines_per_second) {
    ++lines_;
    return true;
  }
  auto it = suppressed_.find(rule);
  if (it == suppressed_.end()) it = suppressed_.emplace(std::string(rule), 0).first;
  ++it->second;
  return false;
}

void rejection_log::flush() {
  std::map<std::string, std::uint64_t, std::less<>> counts;
  {
    std::lock_guard lock(mu_);
    lines_ = 0;
    counts.swap(suppressed_);
  }
  for (const auto& [rule, n] : counts) {
    spdlog::info("event=rejections_not_logged rule={} count={} interval_ms=1000", rule, n);
  }
}

}  // namespace sluice::server
