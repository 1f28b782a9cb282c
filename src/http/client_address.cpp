// SPDX-License-Identifier: Apache-2.0
// Client addresses: IP parsing, CIDR blocks, and the walk over X-Forwarded-For / Forwarded.
#include "sluice/http/client_address.hpp"

#include <arpa/inet.h>
#include <endian.h>

#include <algorithm>
#include <cstring>

namespace sluice::http {

namespace {

constexpr std::array<std::uint8_t, 12> v4_mapped_prefix = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
constexpr std::size_t max_hop_bytes = 256;
constexpr int max_hops = 64;

std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool iequals(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

// One hop of X-Forwarded-For or a Forwarded `for=` value: "192.0.2.1", "192.0.2.1:8080",
// "2001:db8::1", "[2001:db8::1]" or "[2001:db8::1]:8080".
std::optional<ip_address> parse_node(std::string_view s) noexcept {
  s = trim(s);
  if (s.empty()) return std::nullopt;
  if (s.front() == '[') {
    auto close = s.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    std::string_view rest = s.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':' || rest.size() < 2 || rest.size() > 6) return std::nullopt;
      for (char c : rest.substr(1)) {
        if (c < '0' || c > '9') return std::nullopt;
      }
    }
    return parse_ip(s.substr(1, close - 1));
  }
  if (auto a = parse_ip(s)) return a;
  // "a.b.c.d:port": exactly one colon, digits after it.
  auto colon = s.find(':');
  if (colon == std::string_view::npos || s.find(':', colon + 1) != std::string_view::npos) return std::nullopt;
  std::string_view port = s.substr(colon + 1);
  if (port.empty() || port.size() > 5) return std::nullopt;
  for (char c : port) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  auto a = parse_ip(s.substr(0, colon));
  if (!a || !a->is_v4()) return std::nullopt;
  return a;
}

// The list element ending at `end` (exclusive) of a comma-separated header, found scanning right to
// left: commas inside quoted strings do not split. Sets `start` to the element's first byte and
// returns false when the element is longer than max_hop_bytes (no proxy writes one that long).
bool previous_element(std::string_view s, std::size_t end, std::size_t& start) noexcept {
  bool quoted = false;
  std::size_t i = end;
  while (i > 0) {
    const char c = s[i - 1];
    if (c == '"' && !(i >= 2 && s[i - 2] == '\\')) {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      break;
    }
    --i;
    if (end - i > max_hop_bytes) return false;
  }
  start = i;
  return !quoted;
}

// The `for` value of one Forwarded element ("for=192.0.2.60;proto=http;by=203.0.113.43"), or
// nullopt when the element is malformed, has no `for`, or it is not an IP address.
std::optional<ip_address> forwarded_for(std::string_view element) {
  std::optional<ip_address> found;
  bool seen = false;
  std::size_t pos = 0;
  while (pos <= element.size()) {
    // One pair, up to the next ';' outside quotes.
    std::size_t end = pos;
    bool quoted = false;
    for (; end < element.size(); ++end) {
      char c = element[end];
      if (quoted) {
        if (c == '\\')
          ++end;
        else if (c == '"')
          quoted = false;
      } else if (c == '"') {
        quoted = true;
      } else if (c == ';') {
        break;
      }
    }
    std::string_view pair = trim(element.substr(pos, std::min(end, element.size()) - pos));
    pos = end + 1;
    if (pair.empty()) continue;
    auto eq = pair.find('=');
    if (eq == std::string_view::npos) return std::nullopt;
    std::string_view name = trim(pair.substr(0, eq));
    std::string_view value = trim(pair.substr(eq + 1));
    if (!iequals(name, "for")) continue;
    if (seen) return std::nullopt;  // two `for` in one element: ambiguous
    seen = true;
    std::string unquoted;
    if (!value.empty() && value.front() == '"') {
      if (value.size() < 2 || value.back() != '"') return std::nullopt;
      for (std::size_t i = 1; i + 1 < value.size(); ++i) {
        if (value[i] == '\\' && i + 2 < value.size()) ++i;
        unquoted += value[i];
      }
      value = unquoted;
    }
    found = parse_node(value);
    if (!found) return std::nullopt;
  }
  return found;
}

// Right to left over the hops the trusted proxies appended: the first hop not in `trusted` is the
// client (all trusted: the leftmost). Only the hops up to that one are parsed, so whatever a client
// wrote further left (junk, an open quote, padding, a thousand hops) never matters. nullopt when a
// hop in that part does not parse or there are more than max_hops of them.
template <class HopParser>
std::optional<ip_address> walk_hops(std::string_view header, const std::vector<cidr>& trusted, HopParser parse) {
  std::optional<ip_address> last;
  std::size_t end = header.size();
  for (int hops = 0; hops < max_hops; ++hops) {
    std::size_t start = 0;
    if (!previous_element(header, end, start)) return std::nullopt;
    auto a = parse(header.substr(start, end - start));
    if (!a) return std::nullopt;
    last = a;
    bool is_trusted = std::any_of(trusted.begin(), trusted.end(), [&](const cidr& c) { return c.contains(*a); });
    if (!is_trusted) return a;
    if (start == 0) return last;  // every hop was a trusted proxy
    end = start - 1;              // before the comma
  }
  return std::nullopt;
}

std::optional<ip_address> peer_address(std::string_view peer) {
  if (auto a = parse_ip(peer)) return a;
  return parse_node(peer);  // some servers report "[::1]" or "1.2.3.4:5678"
}

}  // namespace

bool ip_address::is_v4() const noexcept {
  return std::equal(v4_mapped_prefix.begin(), v4_mapped_prefix.end(), bytes.begin());
}

namespace {

// What inet_pton(AF_INET) accepts, without its copy and call on every request: four decimal parts
// of 1 to 3 digits, each 0..255 and without a leading zero, separated by dots.
bool parse_dotted_quad(std::string_view text, std::uint8_t out[4]) noexcept {
  std::size_t at = 0;
  for (int part = 0; part < 4; ++part) {
    if (part > 0) {
      if (at >= text.size() || text[at] != '.') return false;
      ++at;
    }
    const std::size_t start = at;
    unsigned value = 0;
    while (at < text.size() && at - start < 4 && text[at] >= '0' && text[at] <= '9') {
      value = value * 10 + static_cast<unsigned>(text[at] - '0');
      ++at;
    }
    const std::size_t digits = at - start;
    if (digits == 0 || digits > 3 || value > 255 || (digits > 1 && text[start] == '0')) return false;
    out[part] = static_cast<std::uint8_t>(value);
  }
  return at == text.size();
}

}  // namespace

std::optional<ip_address> parse_ip(std::string_view text) noexcept {
  ip_address a;
  // A dotted quad first; else IPv6, whose text has a ':'.
  if (std::uint8_t v4[4]; parse_dotted_quad(text, v4)) {
    std::copy(v4_mapped_prefix.begin(), v4_mapped_prefix.end(), a.bytes.begin());
    std::copy(v4, v4 + 4, a.bytes.begin() + 12);
    return a;
  }
  if (text.find(':') == std::string_view::npos) return std::nullopt;
  // inet_pton needs a terminated string; the longest textual IPv6 address is 45 characters.
  char buf[64];
  if (text.size() >= sizeof buf || text.find('\0') != std::string_view::npos) return std::nullopt;
  std::memcpy(buf, text.data(), text.size());
  buf[text.size()] = '\0';
  if (inet_pton(AF_INET6, buf, a.bytes.data()) != 1) return std::nullopt;
  return a;
}

char* write_text(const ip_address& a, char* out) noexcept {
  if (a.is_v4()) {  // on every request keyed by IP: cheaper than inet_ntop's printf
    for (std::size_t i = 12; i < 16; ++i) {
      if (i > 12) *out++ = '.';
      const unsigned v = a.bytes[i];
      if (v >= 100) *out++ = static_cast<char>('0' + v / 100);
      if (v >= 10) *out++ = static_cast<char>('0' + v / 10 % 10);
      *out++ = static_cast<char>('0' + v % 10);
    }
    return out;
  }
  static_assert(INET6_ADDRSTRLEN <= 46);
  if (!inet_ntop(AF_INET6, a.bytes.data(), out, INET6_ADDRSTRLEN)) return out;
  return out + std::strlen(out);
}

std::string to_string(const ip_address& a) {
  char buf[46];
  return std::string(buf, write_text(a, buf));
}

ip_address masked(ip_address a, int prefix) noexcept {
  for (int i = 0; i < 16; ++i) {
    int bits = std::clamp(prefix - i * 8, 0, 8);
    a.bytes[i] &= static_cast<std::uint8_t>(0xff00u >> bits);
  }
  return a;
}

namespace {

// Bytes [at, at + 8) of an address as one number, the first byte the most significant.
std::uint64_t word(const ip_address& a, std::size_t at) noexcept {
  std::uint64_t w;
  std::memcpy(&w, a.bytes.data() + at, sizeof w);
  return be64toh(w);
}

// The first `bits` bits of a word (none for bits <= 0, all for bits >= 64).
std::uint64_t first_bits(int bits) noexcept { return bits <= 0 ? 0 : ~std::uint64_t{0} << (64 - std::min(bits, 64)); }

}  // namespace

bool cidr::contains(const ip_address& a) const noexcept {
  // Two 64-bit words under the prefix's mask, without a memcmp call: this runs for the peer and for
  // each proxy hop of every request.
  return ((word(a, 0) ^ word(base, 0)) & first_bits(prefix)) == 0 &&
         ((word(a, 8) ^ word(base, 8)) & first_bits(prefix - 64)) == 0;
}

result<cidr> parse_cidr(std::string_view text) {
  std::string_view t = trim(text);
  auto slash = t.find('/');
  auto a = parse_ip(t.substr(0, slash));
  if (!a)
    return error(errc::invalid_argument, "trusted proxy '" + std::string(text) + "' is not an address or CIDR block");
  int max = a->is_v4() ? 32 : 128;
  int prefix = max;
  if (slash != std::string_view::npos) {
    std::string_view digits = t.substr(slash + 1);
    if (digits.empty() || digits.size() > 3) {
      return error(errc::invalid_argument, "trusted proxy '" + std::string(text) + "' has a bad prefix length");
    }
    prefix = 0;
    for (char c : digits) {
      if (c < '0' || c > '9') {
        return error(errc::invalid_argument, "trusted proxy '" + std::string(text) + "' has a bad prefix length");
      }
      prefix = prefix * 10 + (c - '0');
    }
    if (prefix > max) {
      return error(errc::invalid_argument,
                   "trusted proxy '" + std::string(text) + "' has a prefix longer than " + std::to_string(max));
    }
  }
  if (a->is_v4()) prefix += 96;
  return cidr{.base = masked(*a, prefix), .prefix = prefix};
}

std::optional<ip_address> client_address(const address_sources& sources, const std::vector<cidr>& trusted,
                                         forwarding_header which) {
  auto peer = sources.peer_ip ? sources.peer_ip : peer_address(sources.peer);
  if (!peer) return std::nullopt;
  bool peer_trusted = std::any_of(trusted.begin(), trusted.end(), [&](const cidr& c) { return c.contains(*peer); });
  if (!peer_trusted) return peer;

  // A trusted proxy that forwards nothing sent the request itself.
  bool is_forwarded = which == forwarding_header::forwarded;
  std::string_view header = trim(is_forwarded ? sources.forwarded : sources.x_forwarded_for);
  if (header.empty()) return peer;
  return is_forwarded ? walk_hops(header, trusted, forwarded_for) : walk_hops(header, trusted, parse_node);
}

}  // namespace sluice::http
