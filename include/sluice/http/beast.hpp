// SPDX-License-Identifier: Apache-2.0
// sluice/http/beast.hpp — the rate-limiting middleware for Boost.Beast servers.
//
// `limiter::check` is awaited in the C++20 coroutine session loop: it derives the key, asks the
// backend through `backend::async_check` and resumes the coroutine on its own executor, so a
// Redis-backed check never blocks an I/O thread. `limiter::serve` wraps a handle_request-style
// function: refused requests get the 429 (with Retry-After, X-RateLimit-* and the JSON body),
// admitted ones the handler's response plus the X-RateLimit-* fields.
//
//   sluice::http::beast::limiter lim(mw, [](const auto& req) -> std::optional<sluice::http::identity> {
//     return my_auth(req);                        // nullopt: anonymous
//   });
//   // in the session coroutine, after http::async_read(stream, buffer, req, use_awaitable):
//   auto res = co_await lim.serve(req, peer_address, handle_request);
//   co_await http::async_write(stream, res, use_awaitable);
//
// Thread-safe: one limiter may serve every session and thread. It shares ownership of the
// middleware, and a check in flight keeps the middleware alive by itself, so a limiter (or its
// middleware) may be replaced while Redis checks are outstanding.
#pragma once

#include <utility>  // Boost 1.74's awaitable.hpp uses std::exchange without including it

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>
#include <functional>
#include <memory>
#include <optional>

#include "sluice/http/middleware.hpp"

namespace sluice::http::beast {

using request = boost::beast::http::request<boost::beast::http::string_body>;
using response = boost::beast::http::response<boost::beast::http::string_body>;

/// The service's authentication: who sent the request, or nullopt for anonymous. Called only for
/// routes keyed on an identity or with a dual-layer rule (middleware::needs_identity); must not block.
using identify_function = std::function<std::optional<identity>(const request&)>;

/// A handle_request-style function.
using handler_function = std::function<response(const request&)>;

/// What to do with one request.
class verdict {
 public:
  verdict() = default;
  explicit verdict(outcome o) : outcome_(std::move(o)) {}

  /// False when the request must be answered with refusal() instead of running the handler.
  bool admitted() const noexcept { return outcome_.action != outcome::action::refuse; }
  /// The 429 response (HTTP version and keep-alive taken from `req`).
  response refusal(const request& req) const;
  /// Adds the rate-limit header fields to an admitted request's response (replacing any the
  /// handler set). They go in as one preformatted element of Beast's container, the first field's,
  /// whose value carries the others' lines: on the wire they are separate fields, but
  /// `res[name]` finds only the first. Calling it again replaces them.
  void apply(response& res) const;
  const sluice::http::outcome& result() const noexcept { return outcome_; }

 private:
  sluice::http::outcome outcome_;
};

class limiter {
 public:
  /// `identify` may be empty when no route keys on an identity.
  limiter(std::shared_ptr<middleware> mw, identify_function identify);

  /// Checks a request; the coroutine resumes on its own executor.
  boost::asio::awaitable<verdict> check(const request& req, const boost::asio::ip::address& peer) const;

  /// Checks a request and returns the response to send: the 429, or handler(req) with headers added.
  boost::asio::awaitable<response> serve(const request& req, const boost::asio::ip::address& peer,
                                         const handler_function& handler) const;

  /// Callback form: `done` runs on `executor`. `req` must stay valid until `done` runs.
  void async_check(const request& req, const boost::asio::ip::address& peer, boost::asio::any_io_executor executor,
                   std::function<void(verdict)> done) const;

  middleware& get() const noexcept { return *mw_; }

 private:
  std::optional<pending_check> prepare(const request& req, const boost::asio::ip::address& peer) const;
  // The verdict of a backend that completes inline (completes_inline()).
  verdict decide_inline(const request& req, const boost::asio::ip::address& peer) const;

  std::shared_ptr<middleware> mw_;
  identify_function identify_;
};

}  // namespace sluice::http::beast
