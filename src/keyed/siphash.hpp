// SPDX-License-Identifier: Apache-2.0
// siphash.hpp (private) — SipHash, a keyed hash for tables whose keys come from outside.
//
// With a secret random key per table, nobody can compute in advance a set of keys that collide, so
// a flood of chosen keys cannot turn a table's O(1) lookups into long probe chains. The keyed tables
// use SipHash-1-3 (one compression round, three finalisation rounds, as Rust's HashMap does);
// SipHash-2-4 is the reference variant the tests check against the published vectors.
//
// Thread-safe: pure functions.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <random>
#include <string_view>

namespace sluice::detail {

struct sip_key {
  std::uint64_t k0 = 0;
  std::uint64_t k1 = 0;
};

template <int CompressionRounds, int FinalRounds>
std::uint64_t siphash(const sip_key& key, std::string_view data) noexcept {
  std::uint64_t v0 = key.k0 ^ 0x736f6d6570736575ULL;
  std::uint64_t v1 = key.k1 ^ 0x646f72616e646f6dULL;
  std::uint64_t v2 = key.k0 ^ 0x6c7967656e657261ULL;
  std::uint64_t v3 = key.k1 ^ 0x7465646279746573ULL;
  auto round = [&] {
    v0 += v1, v1 = std::rotl(v1, 13), v1 ^= v0, v0 = std::rotl(v0, 32);
    v2 += v3, v3 = std::rotl(v3, 16), v3 ^= v2;
    v0 += v3, v3 = std::rotl(v3, 21), v3 ^= v0;
    v2 += v1, v1 = std::rotl(v1, 17), v1 ^= v2, v2 = std::rotl(v2, 32);
  };
  auto absorb = [&](std::uint64_t m) {
    v3 ^= m;
    for (int i = 0; i < CompressionRounds; ++i) round();
    v0 ^= m;
  };
  const char* p = data.data();
  std::size_t n = data.size();
  for (; n >= 8; p += 8, n -= 8) {
    std::uint64_t m;
    std::memcpy(&m, p, 8);  // little-endian load on the platforms we build for (x86-64, arm64)
    absorb(m);
  }
  std::uint64_t last = static_cast<std::uint64_t>(data.size()) << 56;
  for (std::size_t i = 0; i < n; ++i) last |= static_cast<std::uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  absorb(last);
  v2 ^= 0xff;
  for (int i = 0; i < FinalRounds; ++i) round();
  return v0 ^ v1 ^ v2 ^ v3;
}

/// A secret key for one table, from the system's random source.
inline sip_key random_sip_key() {
  std::random_device rd;
  auto word = [&] { return (static_cast<std::uint64_t>(rd()) << 32) | rd(); };
  return {word(), word()};
}

/// A table's hash of keys that come from outside, for std::unordered_map (transparent: lookups
/// by string_view).
struct keyed_hash {
  using is_transparent = void;
  sip_key key = random_sip_key();
  std::size_t operator()(std::string_view s) const noexcept { return siphash<1, 3>(key, s); }
};

static_assert(std::endian::native == std::endian::little, "siphash loads words little-endian");

}  // namespace sluice::detail
