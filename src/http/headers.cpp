// SPDX-License-Identifier: Apache-2.0
#include "sluice/http/headers.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>

namespace sluice::http {

void header_fields::add(std::string_view name, std::string_view value) {
  if (count_ == max_fields || name.size() > 255 || value.size() > std::numeric_limits<std::uint32_t>::max() - used_) {
    throw std::length_error("header_fields: more than six fields, or a name too long");
  }
  if (!spilled_ && used_ + value.size() > inline_.size()) {
    heap_.assign(inline_.data(), used_);
    spilled_ = true;
  }
  if (spilled_) {
    heap_.append(value);
  } else if (!value.empty()) {
    std::memcpy(inline_.data() + used_, value.data(), value.size());
  }
  record(name, static_cast<std::uint32_t>(value.size()));
}

void header_fields::record(std::string_view name, std::uint32_t size) noexcept {
  fields_[count_++] = {name.data(), static_cast<std::uint8_t>(name.size()), used_, size};
  used_ += size;
}

void header_fields::add(std::string_view name, std::int64_t v) {
  constexpr std::size_t most_digits = 20;
  if (spilled_ || used_ + most_digits > inline_.size() || count_ == max_fields || name.size() > 255) {
    char digits[most_digits];
    auto [end, ec] = std::to_chars(digits, digits + sizeof digits, v);
    add(name, std::string_view(digits, static_cast<std::size_t>(end - digits)));
    return;
  }
  // The common case: the digits straight into the inline text.
  char* at = inline_.data() + used_;
  auto [end, ec] = std::to_chars(at, at + most_digits, v);
  record(name, static_cast<std::uint32_t>(end - at));
}

std::int64_t ceil_seconds(nanoseconds d) noexcept {
  if (d <= nanoseconds::zero()) return 0;
  constexpr std::int64_t ns_per_s = 1'000'000'000;
  return d.count() / ns_per_s + (d.count() % ns_per_s != 0 ? 1 : 0);
}

std::int64_t ceil_milliseconds(nanoseconds d) noexcept {
  if (d == never) return 86'400'000;
  if (d <= nanoseconds::zero()) return 0;
  constexpr std::int64_t ns_per_ms = 1'000'000;
  return d.count() / ns_per_ms + (d.count() % ns_per_ms != 0 ? 1 : 0);
}

std::int64_t retry_after_seconds(const decision& d) noexcept {
  constexpr std::int64_t one_day = 86'400;
  if (d.retry_after == never) return one_day;
  std::int64_t s = ceil_seconds(d.retry_after);
  return s < 1 ? 1 : s;
}

std::int64_t retry_after_milliseconds(const decision& d) noexcept {
  if (d.allowed) return 0;
  return std::max<std::int64_t>(1, ceil_milliseconds(d.retry_after));
}

std::int64_t policy_window_seconds(const policy& p) noexcept {
  if (p.algorithm != algorithm::token_bucket) return std::max<std::int64_t>(1, ceil_seconds(p.window));
  if (p.rate.per_second <= 0 || p.rate.is_infinite()) return 1;
  double s = std::ceil(static_cast<double>(p.burst) / p.rate.per_second);
  constexpr double cap = 1e12;  // far beyond any real window; keeps the cast defined
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(std::min(s, cap)));
}

namespace {

// A structured-field string item: the rule name with '"' and '\' escaped and non-printable ASCII
// dropped (names come from config, but the header must stay valid whatever they hold).
std::string sf_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c < 0x20 || c > 0x7e) continue;
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  out += '"';
  return out;
}

}  // namespace

header_fields rate_limit_headers(const decision& d, const rule& r, std::chrono::system_clock::time_point wall_now,
                                 const header_options& options) {
  header_fields fields;
  add_rate_limit_headers(fields, d, r, wall_now, options);
  return fields;
}

void add_rate_limit_headers(header_fields& fields, const decision& d, const rule& r,
                            std::chrono::system_clock::time_point wall_now, const header_options& options) {
  std::int64_t reset_s = ceil_seconds(d.reset_after);
  std::int64_t remaining = d.remaining < 0 ? 0 : d.remaining;
  if (options.legacy_fields) {
    auto unix_now = std::chrono::duration_cast<std::chrono::seconds>(wall_now.time_since_epoch()).count();
    fields.add("X-RateLimit-Limit", d.limit);
    fields.add("X-RateLimit-Remaining", remaining);
    fields.add("X-RateLimit-Reset", unix_now + reset_s);
  }
  if (options.ietf_fields) {
    // For a dual-layer rule the figures shown are those of the binding layer.
    const policy& p = d.dual_layer && d.binding == layer::tenant && r.tenant ? *r.tenant : r.limit;
    std::string name = sf_string(r.name);
    fields.add("RateLimit-Policy",
               name + ";q=" + std::to_string(d.limit) + ";w=" + std::to_string(policy_window_seconds(p)));
    fields.add("RateLimit", name + ";r=" + std::to_string(remaining) + ";t=" + std::to_string(reset_s));
  }
  if (!d.allowed) fields.add("Retry-After", retry_after_seconds(d));
}

}  // namespace sluice::http
