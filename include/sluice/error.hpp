// SPDX-License-Identifier: Apache-2.0
// sluice/error.hpp — the project's one error style: status results.
//
// No function of sluice throws on a bad input or a failed backend. Operations that can fail return
// `sluice::result<T>`: either the value or a `sluice::error` (an `std::error_code` in the
// `sluice::errc` category plus a message naming the offending parameter). A refusal by a limiter is
// not an error: it is a `decision` with `allowed == false`.
//
// Reading the value of a result that holds an error (or the error of one that holds a value) is a
// programming error, not a runtime one: it is a checked precondition, always on, that writes the
// held error's message to stderr and calls std::abort() — never an exception. Check `ok()` first,
// or call value() only where an error cannot happen (a factory given options known to be valid).
//
//   auto bucket = sluice::token_bucket::create({.rate = sluice::per_second(5), .burst = 60});
//   if (!bucket) { std::cerr << bucket.error().message << '\n'; return 1; }
//   sluice::result<sluice::decision> d = (*bucket)->try_acquire(now, 1);
//
// Thread-safe: all types here are values.
#pragma once

#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <variant>

namespace sluice {

/// Error conditions of sluice. Values are stable: they appear in logs and metrics.
enum class errc {
  invalid_argument = 1,  ///< A parameter or option is out of its documented range; the message names it.
                         ///< Every library factory and check uses it for a bad input.
  cost_exceeds_burst,    ///< The cost can never be admitted: it is larger than the limiter's capacity.
  key_too_long,          ///< A key or id is longer than `max_key_length`.
  capacity_exhausted,    ///< A keyed limiter is at its key cap and no entry could be evicted.
  deadline_exceeded,     ///< A wait could not complete before its deadline.
  cancelled,             ///< A wait was cancelled through its stop token.
  unknown_rule,          ///< No rule with that name.
  backend_unavailable,   ///< The backend cannot be reached (connection refused, closed, circuit open).
  backend_timeout,       ///< The backend did not answer within the command timeout.
  backend_protocol,      ///< The backend answered something that is not a valid reply.
  backend_overloaded,    ///< Too many checks are already waiting on the backend.
  config_invalid,        ///< sluiced's configuration (a file, or what is made from it) is invalid; the
                         ///< message says where.
};

/// Sets of errc that callers branch on, as std::error_condition (Beast's `condition` does the same
/// for its codes): `if (e.code == sluice::condition::backend_failure) ...`.
enum class condition {
  /// backend_unavailable, backend_timeout, backend_protocol, backend_overloaded: the backend could
  /// not decide, so a failure policy applies — unlike a request that could never be admitted.
  backend_failure = 1,
  /// invalid_argument, cost_exceeds_burst, key_too_long, unknown_rule: the caller's request is at
  /// fault (HTTP 400, gRPC INVALID_ARGUMENT), and nothing changed.
  invalid_request,
};

}  // namespace sluice

template <>
struct std::is_error_code_enum<sluice::errc> : std::true_type {};
template <>
struct std::is_error_condition_enum<sluice::condition> : std::true_type {};

namespace sluice {

/// The category of `errc`; its name is "sluice".
const std::error_category& error_category() noexcept;

inline std::error_code make_error_code(errc e) noexcept { return {static_cast<int>(e), error_category()}; }

/// The category of `condition`; its name is "sluice-condition".
const std::error_category& condition_category() noexcept;

inline std::error_condition make_error_condition(condition c) noexcept {
  return {static_cast<int>(c), condition_category()};
}

/// An error: a code to branch on and a message for people.
struct error {
  std::error_code code;
  std::string message;

  error(errc e, std::string msg) : code(make_error_code(e)), message(std::move(msg)) {}
  error(std::error_code c, std::string msg) : code(c), message(std::move(msg)) {}

  bool operator==(errc e) const noexcept { return code == make_error_code(e); }
  bool operator==(condition c) const noexcept { return code == make_error_condition(c); }
};

namespace detail {

/// The checked preconditions of result<T>: writes "sluice: result::<accessor> ..." with the held
/// error's message (when there is one) to stderr, then calls std::abort(). Never returns.
[[noreturn]] void result_value_of_error(const error& e) noexcept;
[[noreturn]] void result_error_of_value() noexcept;

}  // namespace detail

/// Either a value or an error. Check with `ok()` (or contextual bool) before `value()`.
///
/// Preconditions (checked in every build, never thrown): value(), `*` and `->` need ok(); error()
/// needs !ok(). A violation writes the held error's message to stderr and aborts the process.
template <class T>
class [[nodiscard]] result {
 public:
  result(T value) : v_(std::in_place_index<0>, std::move(value)) {}      // NOLINT: implicit by design
  result(sluice::error e) : v_(std::in_place_index<1>, std::move(e)) {}  // NOLINT
  result(errc e, std::string message) : v_(std::in_place_index<1>, e, std::move(message)) {}
  result(std::error_code e, std::string message) : v_(std::in_place_index<1>, e, std::move(message)) {}

  bool ok() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return ok(); }

  /// The value. Precondition: ok() (else the error's message goes to stderr and the process aborts).
  T& value() & noexcept { return *checked_value(); }
  const T& value() const& noexcept { return *checked_value(); }
  T&& value() && noexcept { return std::move(*checked_value()); }
  T* operator->() noexcept { return checked_value(); }
  const T* operator->() const noexcept { return checked_value(); }
  T& operator*() & noexcept { return value(); }
  const T& operator*() const& noexcept { return value(); }

  /// The error. Precondition: !ok() (else the process aborts).
  const sluice::error& error() const& noexcept {
    const sluice::error* e = std::get_if<1>(&v_);
    if (e == nullptr) [[unlikely]]
      detail::result_error_of_value();
    return *e;
  }

 private:
  T* checked_value() noexcept {
    T* v = std::get_if<0>(&v_);
    if (v == nullptr) [[unlikely]]
      detail::result_value_of_error(*std::get_if<1>(&v_));
    return v;
  }
  const T* checked_value() const noexcept {
    const T* v = std::get_if<0>(&v_);
    if (v == nullptr) [[unlikely]]
      detail::result_value_of_error(*std::get_if<1>(&v_));
    return v;
  }

  std::variant<T, sluice::error> v_;
};

/// A result with no value: success, or an error.
template <>
class [[nodiscard]] result<void> {
 public:
  result() = default;
  result(sluice::error e) : e_(std::move(e)), ok_(false) {}  // NOLINT
  result(errc e, std::string message) : e_(e, std::move(message)), ok_(false) {}
  result(std::error_code e, std::string message) : e_(e, std::move(message)), ok_(false) {}

  bool ok() const noexcept { return ok_; }
  explicit operator bool() const noexcept { return ok_; }
  /// The error; an empty one (a zero code, no message) when ok().
  const sluice::error& error() const& noexcept { return e_; }

 private:
  sluice::error e_{std::error_code{}, {}};
  bool ok_ = true;
};

}  // namespace sluice
