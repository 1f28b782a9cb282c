// SPDX-License-Identifier: Apache-2.0
// src/redis/slot.hpp — the Redis Cluster hash slot of a key, computed as Redis computes it.
//
// CRC16 (XMODEM: polynomial 0x1021, initial value 0) of the key mod 16384, where a key holding a
// hash tag — the bytes between its first '{' and the first '}' after it, when there are any — is
// hashed by that tag alone. keys.hpp puts every key's tag there, so a dual-layer rule's two keys
// always share a slot.
//
//   std::uint16_t s = sluice::detail::key_slot("sluice:{acme}:api:tb");   // == key_slot("acme")
//
// Thread-safe: a pure function.
#pragma once

#include <cstdint>
#include <string_view>

namespace sluice::detail {

/// Slots of a Redis Cluster.
inline constexpr std::uint16_t slot_count = 16384;

/// CRC16/XMODEM of `bytes`.
std::uint16_t crc16(std::string_view bytes) noexcept;

/// The slot Redis Cluster stores `key` in (0 .. slot_count - 1).
std::uint16_t key_slot(std::string_view key) noexcept;

}  // namespace sluice::detail
