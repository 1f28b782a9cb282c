#include "redis/keys.hpp"

#include <chrono>

namespace sluice::detail {

std::string encode_id(std::string_view id) {
  static constexpr char hex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(id.size());
  for (char ch : id) {
    const auto b = static_cast<unsigned char>(ch);
    if (b > 0x20 && b < 0x7f && b != '{' && b != '}' && b != ':' && b != '%') {
      out.push_back(ch);
    } else {
      out.push_back('%');
      out.push_back(hex[b >> 4]);
      out.push_back(hex[b & 0xf]);
    }
  }
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
  return std::string(name) + "." +
         std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(p.window).count());
}

std::string single_key(std::string_view prefix, std::string_view rule, std::string_view key, std::string_view tag) {
  std::string k(prefix);
  k += '{';
  k += encode_id(rule);
  k += ':';
  k += encode_id(key);
  k += "}:";
  k += tag;
  return k;
}

std::string tenant_key(std::string_view prefix, std::string_view rule, std::string_view tenant, std::string_view tag) {
  std::string k(prefix);
  k += '{';
  k += encode_id(tenant);
  k += "}:";
  k += encode_id(rule);
  k += ':';
  k += tag;
  return k;
}

std::string user_key(std::string_view prefix, std::string_view rule, std::string_view tenant, std::string_view user,
                     std::string_view tag) {
  std::string k(prefix);
  k += '{';
  k += encode_id(tenant);
  k += "}:";
  k += encode_id(rule);
  k += ":user:";
  k += encode_id(user);
  k += ':';
  k += tag;
  return k;
}

}  // namespace sluice::detail
