// SPDX-License-Identifier: Apache-2.0
// sluice/http/httplib.hpp — the rate-limiting middleware for cpp-httplib servers.
//
// cpp-httplib runs each request on a worker thread, so the check is a blocking backend check made
// in the server's pre-routing handler: a refused request is answered there (429, Retry-After,
// X-RateLimit-*, JSON body) and the handler returns Handled; an admitted request gets its
// X-RateLimit-* fields set on the response before routing, so the route's handler keeps them.
//
//   httplib::Server server;
//   sluice::http::httplib::limiter lim(mw, [](const httplib::Request& req) {
//     return my_auth(req);                        // std::optional<sluice::http::identity>
//   });
//   lim.install(server);                          // or call lim(req, res) from your own pre-routing handler
//
// Thread-safe: one limiter serves all worker threads. install() keeps a copy of the limiter.
#pragma once

#include <httplib.h>

#include <functional>
#include <memory>
#include <optional>

#include "sluice/http/middleware.hpp"

namespace sluice::http::httplib {

/// The service's authentication: who sent the request, or nullopt for anonymous. Called only for
/// routes keyed on an identity or with a dual-layer rule (middleware::needs_identity).
using identify_function = std::function<std::optional<identity>(const ::httplib::Request&)>;

class limiter {
 public:
  /// `identify` may be empty when no route keys on an identity.
  limiter(std::shared_ptr<middleware> mw, identify_function identify);

  /// The pre-routing step: Handled when the 429 has been written to `res`, Unhandled otherwise
  /// (with the rate-limit fields already set on `res`).
  ::httplib::Server::HandlerResponse operator()(const ::httplib::Request& req, ::httplib::Response& res) const;

  /// Makes this limiter the server's pre-routing handler.
  void install(::httplib::Server& server) const;

  middleware& get() const noexcept { return *mw_; }

 private:
  std::shared_ptr<middleware> mw_;
  identify_function identify_;
};

}  // namespace sluice::http::httplib
