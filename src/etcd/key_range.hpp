// SPDX-License-Identifier: Apache-2.0
// src/etcd/key_range.hpp (private) — the [key, range_end) that etcd's Range and Watch take for
// "every key with this prefix".
//
//   prefix_range("/sluice/")  == {"/sluice/", "/sluice0"}   ('/' + 1 == '0')
//   prefix_range("a\xff")     == {"a\xff", "b"}             (a trailing 0xff cannot be incremented)
//   prefix_range("")          == {"\0", "\0"}               (every key; etcd refuses an empty key)
//
// Thread-safe: a pure function.
#pragma once

#include <string>
#include <string_view>

namespace sluice::etcd::detail {

struct key_range {
  std::string key;        ///< The first key of the range.
  std::string range_end;  ///< The first key after it; "\0" is the end of the keyspace.

  bool operator==(const key_range&) const = default;
};

/// The keys that start with `prefix`: from the prefix to the prefix without its trailing 0xff
/// bytes and its last byte plus one ("\0" when nothing is left).
key_range prefix_range(std::string_view prefix);

}  // namespace sluice::etcd::detail
