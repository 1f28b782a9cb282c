// SPDX-License-Identifier: Apache-2.0
// sluice/http/headers.hpp — the one function that turns a decision into HTTP header fields.
//
// sluiced and both middlewares call `rate_limit_headers`, so every surface sends the same values:
//   X-RateLimit-Limit      the limit (burst or N)
//   X-RateLimit-Remaining  whole units left
//   X-RateLimit-Reset      Unix time, whole seconds (rounded up), at which the limiter is full again
//   Retry-After            on refusal only: whole seconds, rounded up, at least 1
//   RateLimit-Policy, RateLimit   (optional) draft-ietf-httpapi-ratelimit-headers structured fields:
//                          RateLimit-Policy: "api";q=60;w=12     RateLimit: "api";r=59;t=1
//
//   for (const auto& f : sluice::http::rate_limit_headers(d, rule, std::chrono::system_clock::now(), {}))
//     response.set(f.name, f.value);
//
// The fields come in a `header_fields`: at most six, their text held inline, so that building them
// on every admitted request allocates nothing (long rule names in the IETF fields move the text
// to the heap).
//
// Thread-safe: pure functions; a header_fields is a value.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "sluice/decision.hpp"
#include "sluice/policy.hpp"

namespace sluice::http {

struct header_options {
  /// Send the X-RateLimit-* fields. Default: true.
  bool legacy_fields = true;
  /// Send the IETF draft's RateLimit-Policy and RateLimit fields. Default: false.
  bool ietf_fields = false;
};

/// One field: its name (a literal of this library) and its value (a view into its header_fields).
struct header_field {
  std::string_view name;
  std::string_view value;
};

/// Up to `max_fields` header fields, in the order added; indexing and iteration yield header_field
/// views valid while this object lives unchanged.
class header_fields {
 public:
  static constexpr std::size_t max_fields = 6;

  /// Appends a field (a seventh, or a name of over 255 bytes, is a logic error:
  /// std::length_error). `name` must outlive this object; `value` is copied.
  void add(std::string_view name, std::string_view value);
  /// Appends a field whose value is `v` in decimal.
  void add(std::string_view name, std::int64_t v);

  std::size_t size() const noexcept { return count_; }
  bool empty() const noexcept { return count_ == 0; }
  header_field operator[](std::size_t i) const noexcept {
    const entry& e = fields_[i];
    return {std::string_view(e.name, e.name_size), std::string_view(text() + e.at, e.size)};
  }
  header_field at(std::size_t i) const {
    if (i >= count_) throw std::out_of_range("header_fields::at");
    return (*this)[i];
  }
  header_field front() const noexcept { return (*this)[0]; }

  class iterator {
   public:
    using value_type = header_field;
    using difference_type = std::ptrdiff_t;
    iterator() = default;
    iterator(const header_fields* f, std::size_t i) noexcept : f_(f), i_(i) {}
    header_field operator*() const noexcept { return (*f_)[i_]; }
    iterator& operator++() noexcept {
      ++i_;
      return *this;
    }
    iterator operator++(int) noexcept { return {f_, i_++}; }
    bool operator==(const iterator& o) const noexcept { return i_ == o.i_; }

   private:
    const header_fields* f_ = nullptr;
    std::size_t i_ = 0;
  };
  iterator begin() const noexcept { return {this, 0}; }
  iterator end() const noexcept { return {this, count_}; }

 private:
  // Offsets, not pointers, into the text: a copy needs no fixing up. Small, as outcomes are
  // moved through coroutine frames: this library's names are at most 21 bytes.
  struct entry {
    const char* name = nullptr;
    std::uint8_t name_size = 0;
    std::uint32_t at = 0;
    std::uint32_t size = 0;
  };
  const char* text() const noexcept { return spilled_ ? heap_.data() : inline_.data(); }
  // Adds the entry of a value of `size` bytes just written at the end of the text.
  void record(std::string_view name, std::uint32_t size) noexcept;

  std::array<entry, max_fields> fields_{};
  std::uint8_t count_ = 0;
  bool spilled_ = false;  // the text outgrew inline_ and is all in heap_
  std::uint32_t used_ = 0;
  std::array<char, 64> inline_{};  // the legacy fields and Retry-After take under 40 bytes
  std::string heap_{};
};

/// Whole seconds, rounded up; 0 stays 0. Negative durations give 0.
std::int64_t ceil_seconds(nanoseconds d) noexcept;

/// Whole milliseconds, rounded up, as every JSON answer gives durations; `never` gives one day.
std::int64_t ceil_milliseconds(nanoseconds d) noexcept;

/// The Retry-After value for a refusal: ceil_seconds(retry_after), at least 1. A `never` retry
/// gives one day (clients must not read it as "retry now").
std::int64_t retry_after_seconds(const decision& d) noexcept;

/// The `retry_after_ms` of every JSON answer (sluiced's decisions, the middleware's 429 body): 0
/// when admitted, else the wait in whole milliseconds rounded up, at least 1; `never` gives one day,
/// as Retry-After does.
std::int64_t retry_after_milliseconds(const decision& d) noexcept;

/// The header fields for a decision of `r` made at wall-clock time `wall_now`.
header_fields rate_limit_headers(const decision& d, const rule& r, std::chrono::system_clock::time_point wall_now,
                                 const header_options& options);

/// The same, added to `out` (an outcome's fields, built in place).
void add_rate_limit_headers(header_fields& out, const decision& d, const rule& r,
                            std::chrono::system_clock::time_point wall_now, const header_options& options);

/// The window, in whole seconds, the IETF `w` parameter reports: the window of a window policy,
/// or burst / rate (the time to refill an empty bucket) for a token bucket.
std::int64_t policy_window_seconds(const policy& p) noexcept;

}  // namespace sluice::http
