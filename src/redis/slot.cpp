// SPDX-License-Identifier: Apache-2.0
#include "redis/slot.hpp"

#include <array>

namespace sluice::detail {
namespace {

constexpr std::array<std::uint16_t, 256> make_table() {
  std::array<std::uint16_t, 256> t{};
  for (unsigned i = 0; i < 256; ++i) {
    std::uint16_t c = static_cast<std::uint16_t>(i << 8);
    for (int bit = 0; bit < 8; ++bit) c = static_cast<std::uint16_t>((c & 0x8000) ? (c << 1) ^ 0x1021 : c << 1);
    t[i] = c;
  }
  return t;
}

constexpr std::array<std::uint16_t, 256> table = make_table();

}  // namespace

std::uint16_t crc16(std::string_view bytes) noexcept {
  std::uint16_t crc = 0;
  for (char ch : bytes) {
    crc = static_cast<std::uint16_t>((crc << 8) ^ table[((crc >> 8) ^ static_cast<unsigned char>(ch)) & 0xff]);
  }
  return crc;
}

std::uint16_t key_slot(std::string_view key) noexcept {
  if (const auto open = key.find('{'); open != std::string_view::npos) {
    const auto close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) key = key.substr(open + 1, close - open - 1);
  }
  return crc16(key) & (slot_count - 1);
}

}  // namespace sluice::detail
