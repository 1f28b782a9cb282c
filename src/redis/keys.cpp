// SPDX-License-Identifier: Apache-2.0
#include "redis/keys.hpp"

#include <array>
#include <chrono>

#include "core/composite_key.hpp"

namespace sluice::detail {

namespace {

// Bytes an id keeps as they are: printable ASCII but for the key syntax's `{ } :` and the escape `%`.
constexpr kept_bytes id_kept = [] {
  kept_bytes t{};
  for (int b = 0x21; b < 0x7f; ++b) t[static_cast<std::size_t>(b)] = b != '{' && b != '}' && b != ':' && b != '%';
  return t;
}();

void append_id(std::string& out, std::string_view id) { append_percent_encoded(out, id, id_kept); }

}  // namespace

std::string encode_id(std::string_view id) {
  std::string out;
  out.reserve(id.size());
  append_id(out, id);
  return out;
}

std::string state_tag(const policy& p) {
  std::string_view name = "tb2";
  switch (p.algorithm) {
    case algorithm::token_bucket: return "tb2";
    case algorithm::sliding_window_log: name = "swl"; break;
    case algorithm::sliding_window_counter: name = "swc2"; break;
    case algorithm::fixed_window: name = "fw2"; break;
  }
  // A calendar window's index counts other periods than a plain one's of the same length.
  return std::string(name) + "." +
         std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(p.window).count()) +
         (p.calendar == calendar::none ? "" : "." + std::string(to_string(p.calendar)));
}

std::string single_key(std::string_view prefix, std::string_view rule, std::string_view key, std::string_view tag) {
  std::string k;
  k.reserve(prefix.size() + rule.size() + key.size() + tag.size() + 4);
  k += prefix;
  k += '{';
  append_id(k, rule);
  k += ':';
  append_id(k, key);
  k += "}:";
  k += tag;
  return k;
}

std::string tenant_key(std::string_view prefix, std::string_view rule, std::string_view tenant, std::string_view tag) {
  std::string k;
  k.reserve(prefix.size() + tenant.size() + rule.size() + tag.size() + 5);
  k += prefix;
  k += '{';
  append_id(k, tenant);
  k += "}:";
  append_id(k, rule);
  k += ':';
  k += tag;
  return k;
}

std::string user_key(std::string_view prefix, std::string_view rule, std::string_view tenant, std::string_view user,
                     std::string_view tag) {
  std::string k;
  k.reserve(prefix.size() + tenant.size() + rule.size() + user.size() + tag.size() + 11);
  k += prefix;
  k += '{';
  append_id(k, tenant);
  k += "}:";
  append_id(k, rule);
  k += ":user:";
  append_id(k, user);
  k += ':';
  k += tag;
  return k;
}

}  // namespace sluice::detail
