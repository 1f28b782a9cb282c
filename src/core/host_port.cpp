// SPDX-License-Identifier: Apache-2.0
#include "sluice/host_port.hpp"

#include <charconv>

namespace sluice {

result<host_port> parse_host_port(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return error(errc::invalid_argument, "address \"" + std::string(text.substr(0, 256)) + "\" " + std::string(why) +
                                             " (expected host:port, IPv6 as [::1]:port)");
  };
  const auto colon = text.rfind(':');
  if (colon == std::string_view::npos) return bad("has no port");
  std::string_view host = text.substr(0, colon);
  const std::string_view port = text.substr(colon + 1);
  unsigned p = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  if (port.empty() || ec != std::errc{} || end != port.data() + port.size() || p > 65535) {
    return bad("has no port in 0-65535");
  }
  if (host.starts_with('[')) {
    if (host.size() < 3 || !host.ends_with(']')) return bad("has an unclosed '['");
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string_view::npos) {
    return bad("needs brackets around its IPv6 address");
  }
  if (host.empty()) return bad("has no host");
  return host_port{.host = std::string(host), .port = static_cast<std::uint16_t>(p)};
}

}  // namespace sluice
