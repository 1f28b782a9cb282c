// SPDX-License-Identifier: Apache-2.0
// sluice/http/client_address.hpp — who sent an HTTP request: IP addresses, CIDR blocks of trusted
// proxies, and the walk over the forwarding header they write (X-Forwarded-For or RFC 7239
// Forwarded), in which only what the trusted proxies appended counts.
//
//   std::vector<sluice::http::cidr> trusted{*sluice::http::parse_cidr("10.0.0.0/8")};
//   auto client = sluice::http::client_address({.peer = "10.0.0.7", .x_forwarded_for = "198.51.100.7"}, trusted);
//   // 198.51.100.7; nullopt when no client can be found
//
// Thread-safe: pure functions over values.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/error.hpp"

namespace sluice::http {

/// An IPv4 or IPv6 address. IPv4 is held in its IPv4-mapped IPv6 form, so "192.0.2.1" and
/// "::ffff:192.0.2.1" are the same address.
struct ip_address {
  std::array<std::uint8_t, 16> bytes{};

  bool is_v4() const noexcept;
  friend bool operator==(const ip_address&, const ip_address&) = default;
};

/// Parses a bare address ("192.0.2.1", "2001:db8::1"); anything else (ports, brackets, names,
/// zone ids, surrounding spaces) gives nullopt.
std::optional<ip_address> parse_ip(std::string_view text) noexcept;

/// Canonical text: dotted quad for IPv4 (mapped or not), RFC 5952 form for IPv6.
std::string to_string(const ip_address& a);

/// The same text written at `out`, which has room for 46 bytes; returns the end.
char* write_text(const ip_address& a, char* out) noexcept;

/// `a` with all but its first `prefix` bits (of the IPv6 form) cleared.
ip_address masked(ip_address a, int prefix) noexcept;

/// An address block, "10.0.0.0/8", "2001:db8::/32"; a bare address is a /32 or /128.
struct cidr {
  ip_address base;   ///< Masked to `prefix` bits.
  int prefix = 128;  ///< In IPv6 bits (an IPv4 /8 is held as /104).

  bool contains(const ip_address& a) const noexcept;
};

/// Parses a CIDR block; the error names the input.
result<cidr> parse_cidr(std::string_view text);

/// Where the client address of a request comes from.
struct address_sources {
  std::string_view peer{};              ///< The TCP peer address, as text. Ignored when `peer_ip` is set.
  std::optional<ip_address> peer_ip{};  ///< The TCP peer address, already parsed. Default: unset.
  std::string_view forwarded{};         ///< All `Forwarded` field lines, joined by ", ". Default: empty.
  std::string_view x_forwarded_for{};   ///< All `X-Forwarded-For` field lines, joined by ", ". Default: empty.
};

/// Which header the trusted proxies write. Only that one is read: a proxy passes other headers on
/// untouched, so reading them would let the client choose its own address.
enum class forwarding_header : std::uint8_t {
  x_forwarded_for,  ///< X-Forwarded-For (nginx, HAProxy, most load balancers).
  forwarded,        ///< RFC 7239 Forwarded, its `for=` parameters.
};

/// The client address of a request. `header` is read only when the peer is in `trusted`; it is
/// walked right to left over what the trusted proxies appended, and the first other hop is the
/// client (all trusted: the leftmost; no header: the peer, which sent the request itself). Only
/// the hops up to the client are parsed: what the client wrote to the left of them never matters.
/// nullopt when no client can be found: the peer is not an address, or a hop in the part walked
/// is malformed, not an IP address ("unknown", obfuscated identifiers), longer than 256 bytes, or
/// more than 64 hops deep. The middleware never falls back to the proxy's address.
std::optional<ip_address> client_address(const address_sources& sources, const std::vector<cidr>& trusted,
                                         forwarding_header header = forwarding_header::x_forwarded_for);

/// The key of requests keyed by client IP whose client cannot be found (see client_address): one
/// budget shared by all of them.
inline constexpr std::string_view unresolved_client_key = "ip:unresolved";

}  // namespace sluice::http
