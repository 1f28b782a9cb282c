// SPDX-License-Identifier: Apache-2.0
#include "sluice/http/httplib.hpp"

#include <string>

namespace sluice::http::httplib {

namespace {

// All lines of a header field joined by ", ".
std::string joined(const ::httplib::Request& req, const char* name) {
  std::string out;
  auto range = req.headers.equal_range(name);  // httplib's header map compares names case-insensitively
  for (auto it = range.first; it != range.second; ++it) {
    if (!out.empty()) out += ", ";
    out += it->second;
  }
  return out;
}

}  // namespace

limiter::limiter(std::shared_ptr<middleware> mw, identify_function identify)
    : mw_(std::move(mw)), identify_(std::move(identify)) {}

::httplib::Server::HandlerResponse limiter::operator()(const ::httplib::Request& req, ::httplib::Response& res) const {
  // Match on the decoded path, as httplib's router does, so limiter and routes agree.
  const route_limit* route = mw_->find(req.method, req.path);
  if (!route) return ::httplib::Server::HandlerResponse::Unhandled;

  std::optional<identity> who;
  if (mw_->needs_identity(*route) && identify_) who = identify_(req);
  // Only the configured forwarding header, and only when some proxy is trusted at all.
  bool use_forwarded = mw_->options().client_ip_header == forwarding_header::forwarded;
  std::string forwarding;
  if (!mw_->options().trusted_proxies.empty())
    forwarding = joined(req, use_forwarded ? "Forwarded" : "X-Forwarded-For");
  address_sources from{.peer = req.remote_addr};
  (use_forwarded ? from.forwarded : from.x_forwarded_for) = forwarding;
  auto pending = mw_->prepare(*route, from, who ? &*who : nullptr);
  outcome o = mw_->check(pending);

  for (const auto& h : o.headers) res.set_header(std::string(h.name), std::string(h.value));
  if (o.action != outcome::action::refuse) return ::httplib::Server::HandlerResponse::Unhandled;
  res.status = o.status;
  res.set_content(o.body, "application/json");
  return ::httplib::Server::HandlerResponse::Handled;
}

void limiter::install(::httplib::Server& server) const {
  server.set_pre_routing_handler(
      [self = *this](const ::httplib::Request& req, ::httplib::Response& res) { return self(req, res); });
}

}  // namespace sluice::http::httplib
