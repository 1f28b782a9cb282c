// SPDX-License-Identifier: Apache-2.0
#include "etcd/key_range.hpp"

namespace sluice::etcd::detail {

key_range prefix_range(std::string_view prefix) {
  const std::string keyspace_end(1, '\0');
  if (prefix.empty()) return {.key = keyspace_end, .range_end = keyspace_end};
  std::string end(prefix);
  while (!end.empty() && static_cast<unsigned char>(end.back()) == 0xff) end.pop_back();
  if (end.empty()) return {.key = std::string(prefix), .range_end = keyspace_end};
  end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
  return {.key = std::string(prefix), .range_end = std::move(end)};
}

}  // namespace sluice::etcd::detail
