// SPDX-License-Identifier: Apache-2.0
// Keys built from parts that come from outside — a tenant and a user, an Envoy descriptor's
// entries — and bytes escaped for a key or a header: one way to make each, so that no two inputs
// share a key.
#pragma once

#include <array>
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace sluice::detail {

/// Appends `part` length-prefixed ("4:acme"): no part can end where another begins.
inline void append_counted(std::string& out, std::string_view part) {
  out += std::to_string(part.size());
  out += ':';
  out += part;
}

/// The key of a (tenant, user) pair: the tenant counted, then the user ("4:acmebob").
inline std::string pair_key(std::string_view tenant, std::string_view user) {
  std::string k;
  append_counted(k, tenant);
  k += user;
  return k;
}

/// Which bytes a percent-encoding keeps as they are (the others become %XX).
using kept_bytes = std::array<bool, 256>;

/// Appends `s` percent-encoded (upper-case hex), its kept bytes a run at a time.
inline void append_percent_encoded(std::string& out, std::string_view s, const kept_bytes& kept) {
  static constexpr char hex[] = "0123456789ABCDEF";
  std::size_t run = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (kept[b]) continue;
    out.append(s.data() + run, i - run);
    const char escaped[3] = {'%', hex[b >> 4], hex[b & 0xf]};
    out.append(escaped, 3);
    run = i + 1;
  }
  out.append(s.data() + run, s.size() - run);
}

/// A transparent hash for maps keyed by std::string: a string_view finds its entry without a copy.
/// For keys a config defines; a table of keys from requests hashes with keyed_hash (keyed/siphash.hpp).
struct string_hash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

}  // namespace sluice::detail
