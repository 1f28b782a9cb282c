// SPDX-License-Identifier: Apache-2.0
// sluice/host_port.hpp — "host:port" addresses, parsed in one place (sluiced's listen address, Redis
// addresses, and next etcd endpoints).
//
//   auto a = sluice::parse_host_port("[::1]:6379");   // {.host = "::1", .port = 6379}
//   if (!a) return a.error();                          // invalid_argument, naming the text
//
// Thread-safe: a pure function.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "sluice/error.hpp"

namespace sluice {

struct host_port {
  std::string host;        ///< A name or an address; IPv6 without its brackets.
  std::uint16_t port = 0;  ///< 0 to 65535 (0: any free port, for listening).
};

/// "host:port", with IPv6 written "[addr]:port". Errors (invalid_argument, naming the text): no
/// port, a port that is not a number in 0..65535, an empty host, an unbracketed IPv6 address.
result<host_port> parse_host_port(std::string_view text);

}  // namespace sluice
