#include "redis/keys.hpp"

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

std::string_view algorithm_tag(algorithm a) noexcept {
  switch (a) {
    case algorithm::token_bucket: return "tb";
    case algorithm::sliding_window_log: return "swl";
    case algorithm::sliding_window_counter: return "swc";
    case algorithm::fixed_window: return "fw";
  }
  return "x";
}

std::string single_key(std::string_view prefix, std::string_view rule, std::string_view key, algorithm a) {
  std::string k(prefix);
  k += '{';
  k += encode_id(rule);
  k += ':';
  k += encode_id(key);
  k += "}:";
  k += algorithm_tag(a);
  return k;
}

std::string tenant_key(std::string_view prefix, std::string_view rule, std::string_view tenant, algorithm a) {
  std::string k(prefix);
  k += '{';
  k += encode_id(tenant);
  k += "}:";
  k += encode_id(rule);
  k += ':';
  k += algorithm_tag(a);
  return k;
}

std::string user_key(std::string_view prefix, std::string_view rule, std::string_view tenant, std::string_view user,
                     algorithm a) {
  std::string k(prefix);
  k += '{';
  k += encode_id(tenant);
  k += "}:";
  k += encode_id(rule);
  k += ":user:";
  k += encode_id(user);
  k += ':';
  k += algorithm_tag(a);
  return k;
}

}  // namespace sluice::detail
