// SPDX-License-Identifier: Apache-2.0
#include "sluice/error.hpp"

#include <cstdio>
#include <cstdlib>

namespace sluice {
namespace {

class category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "sluice"; }
  std::string message(int value) const override {
    switch (static_cast<errc>(value)) {
      case errc::invalid_argument: return "invalid argument";
      case errc::cost_exceeds_burst: return "cost exceeds the limiter's capacity";
      case errc::key_too_long: return "key too long";
      case errc::capacity_exhausted: return "key capacity exhausted";
      case errc::deadline_exceeded: return "deadline exceeded";
      case errc::cancelled: return "cancelled";
      case errc::unknown_rule: return "unknown rule";
      case errc::backend_unavailable: return "backend unavailable";
      case errc::backend_timeout: return "backend timeout";
      case errc::backend_protocol: return "backend protocol error";
      case errc::backend_overloaded: return "backend overloaded";
      case errc::config_invalid: return "invalid configuration";
    }
    return "unknown sluice error";
  }
};

class condition_category_impl final : public std::error_category {
 public:
  const char* name() const noexcept override { return "sluice-condition"; }
  std::string message(int value) const override {
    switch (static_cast<condition>(value)) {
      case condition::backend_failure: return "backend failure";
      case condition::invalid_request: return "invalid request";
    }
    return "unknown sluice condition";
  }
  bool equivalent(const std::error_code& code, int value) const noexcept override {
    if (code.category() != sluice::error_category()) return false;
    const auto e = static_cast<errc>(code.value());
    switch (static_cast<condition>(value)) {
      case condition::backend_failure:
        return e == errc::backend_unavailable || e == errc::backend_timeout || e == errc::backend_protocol ||
               e == errc::backend_overloaded;
      case condition::invalid_request:
        return e == errc::invalid_argument || e == errc::cost_exceeds_burst || e == errc::key_too_long ||
               e == errc::unknown_rule;
    }
    return false;
  }
};

}  // namespace

const std::error_category& error_category() noexcept {
  static const category instance;
  return instance;
}

const std::error_category& condition_category() noexcept {
  static const condition_category_impl instance;
  return instance;
}

namespace detail {

void result_value_of_error(const error& e) noexcept {
  std::fprintf(stderr, "sluice: result::value() called on a result holding an error: %s\n", e.message.c_str());
  std::fflush(stderr);
  std::abort();
}

void result_error_of_value() noexcept {
  std::fputs("sluice: result::error() called on a result holding a value\n", stderr);
  std::fflush(stderr);
  std::abort();
}

}  // namespace detail

}  // namespace sluice
