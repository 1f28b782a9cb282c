// SPDX-License-Identifier: Apache-2.0
#include "sluice/http/middleware.hpp"

#include "sluice/prometheus.hpp"

#include <openssl/evp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

namespace sluice::http {

// --- routes ---------------------------------------------------------------------------------------

namespace detail {

compiled_route compile_route(std::string_view method, std::string_view path, const route_limit* route) noexcept {
  compiled_route c{.method = method, .base = path, .method_code = method_code(method), .route = route};
  if (path == "*") {
    c.path_kind = compiled_route::kind::any;
  } else if (path.size() >= 2 && path.ends_with("/*")) {
    c.path_kind = compiled_route::kind::below;  // "/notes/*": "/notes" and below
    c.base.remove_suffix(2);
  } else if (!path.empty() && path.back() == '*') {
    c.path_kind = compiled_route::kind::prefix;
    c.base.remove_suffix(1);
  }
  return c;
}

}  // namespace detail

bool path_matches(std::string_view pattern, std::string_view path) noexcept {
  return detail::route_matches(detail::compile_route({}, pattern, nullptr), {}, detail::any_method, path);
}

namespace {

std::string_view path_of(std::string_view target) noexcept {
  std::size_t n = 0;  // a loop: find_first_of("?#") calls memchr once per byte of the target
  while (n < target.size() && target[n] != '?' && target[n] != '#') ++n;
  return target.substr(0, n);
}

std::string json_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          static constexpr char hex[] = "0123456789abcdef";
          out += "\\u00";
          out += hex[(c >> 4) & 0xf];
          out += hex[c & 0xf];
        } else {
          out += c;
        }
    }
  }
  return out;
}

// SHA-256 of an id, by OpenSSL (already a dependency of Debian's cpp-httplib). Keys of over-long ids
// are derived from it: a digest every process of a shared (Redis) deployment computes alike, and for
// which no one can craft an id that lands on another caller's key.
std::array<std::uint8_t, 32> sha256(std::string_view data) noexcept {
  std::array<std::uint8_t, 32> out{};
  unsigned int size = 0;
  EVP_Digest(data.data(), data.size(), out.data(), &size, EVP_sha256(), nullptr);
  return out;
}

// "<prefix>:<id>", or, when that would exceed max_key_length, "<prefix>#" and the first 128 bits
// of SHA-256(id) in hex: long ids are limited like short ones (a '#' key never equals a ':' key).
std::string id_key(std::string_view prefix, std::string_view id) {
  std::string key;
  if (prefix.size() + 1 + id.size() <= max_key_length) {
    key.reserve(prefix.size() + 1 + id.size());
    key.append(prefix).append(1, ':').append(id);
    return key;
  }
  static constexpr char hex[] = "0123456789abcdef";
  auto digest = sha256(id);
  key.reserve(prefix.size() + 1 + 32);
  key.append(prefix).append(1, '#');
  for (std::size_t i = 0; i < 16; ++i) {
    key += hex[digest[i] >> 4];
    key += hex[digest[i] & 0xf];
  }
  return key;
}

}  // namespace

std::string refusal_body(std::string_view code, std::string_view message, std::int64_t retry_after_ms) {
  return "{\"error\": {\"code\": \"" + json_escape(code) + "\", \"message\": \"" + json_escape(message) +
         "\"}, \"retry_after_ms\": " + std::to_string(retry_after_ms) + "}";
}

// --- middleware -----------------------------------------------------------------------------------

result<std::shared_ptr<middleware>> middleware::create(middleware_options options) {
  if (!options.backend) return error(errc::invalid_argument, "middleware: backend must be set");
  std::vector<prepared_rule_ptr> prepared;
  for (std::size_t i = 0; i < options.rules.size(); ++i) {
    auto p = options.backend->prepare(options.rules[i]);  // validates the rule, once
    if (!p) return p.error();
    prepared.push_back(std::move(*p));
    for (std::size_t j = 0; j < i; ++j) {
      if (options.rules[j].name == options.rules[i].name) {
        return error(errc::invalid_argument, "middleware: rule '" + options.rules[i].name + "' is defined twice");
      }
    }
  }
  for (const auto& r : options.routes) {
    if (r.path.empty()) return error(errc::invalid_argument, "middleware: a route has an empty path");
    bool known =
        std::any_of(options.rules.begin(), options.rules.end(), [&](const rule& x) { return x.name == r.rule; });
    if (!known)
      return error(errc::unknown_rule, "middleware: route '" + r.path + "' names unknown rule '" + r.rule + "'");
    if (r.cost <= 0) return error(errc::invalid_argument, "middleware: route '" + r.path + "' has cost <= 0");
  }
  for (const auto& e : options.exempt) {
    if (e.path.empty()) return error(errc::invalid_argument, "middleware: an exempt route has an empty path");
  }
  if (options.ipv6_prefix < 1 || options.ipv6_prefix > 128) {
    return error(errc::invalid_argument,
                 "middleware: ipv6_prefix must be in 1..128, got " + std::to_string(options.ipv6_prefix));
  }
  std::vector<cidr> trusted;
  for (const auto& t : options.trusted_proxies) {
    auto c = parse_cidr(t);
    if (!c) return c.error();
    trusted.push_back(*c);
  }
  return std::make_shared<middleware>(private_tag{}, std::move(options), std::move(trusted), std::move(prepared));
}

middleware::middleware(private_tag, middleware_options options, std::vector<cidr> trusted,
                       std::vector<prepared_rule_ptr> prepared)
    : options_(std::move(options)),
      trusted_(std::move(trusted)),
      prepared_(std::move(prepared)),
      counters_(std::make_unique<atomic_counters[]>(options_.rules.size())),
      completes_inline_(options_.backend->completes_inline()) {
  // Exempt rows first: find() stops at the first row that matches.
  for (const auto& e : options_.exempt) table_.push_back(detail::compile_route(e.method, e.path, nullptr));
  for (const auto& r : options_.routes) table_.push_back(detail::compile_route(r.method, r.path, &r));
  for (const auto& r : options_.routes) {
    auto it =
        std::find_if(options_.rules.begin(), options_.rules.end(), [&](const rule& x) { return x.name == r.rule; });
    route_rule_.push_back(static_cast<std::size_t>(it - options_.rules.begin()));
    bool keys_on_identity = r.key == key_by::user || r.key == key_by::tenant || r.key == key_by::api_key;
    route_needs_identity_.push_back(keys_on_identity || it->is_dual_layer());
  }
}

const route_limit* middleware::find(std::string_view method, std::string_view target) const noexcept {
  const std::string_view path = path_of(target);
  const std::uint8_t code = detail::method_code(method);
  for (const auto& c : table_) {
    if (detail::route_matches(c, method, code, path)) return c.route;  // null for an exempt row
  }
  return nullptr;
}

bool middleware::is_trusted_proxy(const ip_address& peer) const noexcept {
  return std::any_of(trusted_.begin(), trusted_.end(), [&](const cidr& c) { return c.contains(peer); });
}

bool middleware::needs_identity(const route_limit& route) const noexcept {
  auto index = static_cast<std::size_t>(&route - options_.routes.data());
  return index < route_needs_identity_.size() && route_needs_identity_[index];
}

pending_check middleware::prepare(const route_limit& route, const address_sources& from, const identity* who) const {
  pending_check p;
  auto index = static_cast<std::size_t>(&route - options_.routes.data());
  p.rule_index_ = route_rule_.at(index);
  const rule& r = options_.rules[p.rule_index_];
  p.prepared_ = prepared_[p.rule_index_].get();
  p.cost_ = route.cost;

  auto client_key = [&]() -> std::string {
    // Never the proxy's address when the client cannot be found: that would give a fresh budget to
    // whoever sends a malformed header. All such requests share one key.
    auto a = client_address(from, trusted_, options_.client_ip_header);
    if (!a) return std::string(unresolved_client_key);
    if (!a->is_v4()) *a = masked(*a, options_.ipv6_prefix);
    char text[3 + 46] = {'i', 'p', ':'};
    return std::string(text, write_text(*a, text + 3));
  };
  auto anonymous = [&]() -> std::string {
    return route.anonymous == anonymous_key::global ? std::string("anonymous") : client_key();
  };

  std::string key;
  bool known = false;  // the identity supplied what the route keys on
  switch (route.key) {
    case key_by::user:
      known = who && !who->user.empty();
      if (known) key = id_key("user", who->user);
      break;
    case key_by::tenant:
      known = who && !who->tenant.empty();
      if (known) key = id_key("tenant", who->tenant);
      break;
    case key_by::api_key:
      known = who && !who->api_key.empty();
      if (known) key = id_key("key", who->api_key);
      break;
    case key_by::client_ip:
      key = client_key();
      known = true;
      break;
    case key_by::global:
      key = "global";
      known = true;
      break;
  }
  if (!known) key = anonymous();

  if (r.is_dual_layer()) {
    // The tenant layer is the caller's tenant whenever the identity names one, whatever the route
    // keys on. Only callers without a tenant form the "anonymous" pseudo-tenant, so anonymous
    // traffic can neither spend a real tenant's budget nor exhaust the one identified callers use.
    bool tenant_known = who && !who->tenant.empty();
    p.tenant_ = tenant_known ? id_key("tenant", who->tenant) : std::string("anonymous");
    p.user_ = std::move(key);
  } else {
    p.key_ = std::move(key);
  }
  return p;
}

outcome middleware::check(const pending_check& pending) {
  return complete(pending, options_.backend->check(pending.request()));
}

void middleware::check_async(pending_check pending, std::function<void(outcome)> done) {
  // The backend's request views the key strings: keep them at one place until the callback.
  // `self` keeps the middleware (its rules, which the request views, and its counters) alive
  // until the callback has run, even if its owners drop it meanwhile.
  auto held = std::make_shared<pending_check>(std::move(pending));
  check_request req = held->request();
  options_.backend->async_check(req, [self = shared_from_this(), held, done = std::move(done)](result<decision> d) {
    done(self->complete(*held, d));
  });
}

outcome middleware::complete(const pending_check& pending, const result<decision>& answer) {
  atomic_counters& c = counters_[pending.rule_index_];
  const rule& r = pending.rule();
  bool shadow = options_.enforcement == enforcement::shadow;
  outcome o;

  if (!answer && (answer.error().code == condition::invalid_request || answer.error() == errc::capacity_exhausted)) {
    // The check itself cannot be made (cost over the burst, an invalid key, the key cap reached):
    // that is not an outage, and letting it through would let a request around the limit. Refuse it.
    c.invalid.fetch_add(1, std::memory_order_relaxed);
    c.refused.fetch_add(1, std::memory_order_relaxed);
    if (shadow) {
      c.admitted.fetch_add(1, std::memory_order_relaxed);
      o.action = outcome::action::pass;
      return o;
    }
    // A full key table may have room again soon; the other errors repeat for the same request.
    bool transient = answer.error().code == errc::capacity_exhausted;
    std::int64_t retry = transient ? 1 : retry_after_seconds(decision{.retry_after = never});
    o.action = outcome::action::refuse;
    o.status = 429;
    o.headers.add("Retry-After", retry);
    // The codes sluiced answers with: capacity_exhausted at the key cap.
    o.body = transient ? refusal_body("capacity_exhausted", "rate limiter at capacity, request refused", retry * 1000)
                       : refusal_body("not_admissible", "the rate limit cannot admit this request", retry * 1000);
    return o;
  }
  if (!answer) {
    c.backend_errors.fetch_add(1, std::memory_order_relaxed);
    if (options_.on_error != failure_policy::deny || shadow) {
      c.admitted.fetch_add(1, std::memory_order_relaxed);
      o.action = outcome::action::pass;
      return o;
    }
    c.refused.fetch_add(1, std::memory_order_relaxed);
    o.action = outcome::action::refuse;
    o.status = 429;
    o.headers.add("Retry-After", "1");
    o.body = refusal_body("backend_unavailable", "rate limiter unavailable, request refused", 1000);
    return o;
  }

  const decision& d = *answer;
  if (d.allowed) {
    c.admitted.fetch_add(1, std::memory_order_relaxed);
    o.action = outcome::action::admit;
    // A fail-open or disabled decision has no figures worth showing.
    if (!shadow && d.source != decision_source::fail_open && d.source != decision_source::disabled) {
      add_rate_limit_headers(o.headers, d, r, std::chrono::system_clock::now(), options_.headers);
    }
    return o;
  }

  c.refused.fetch_add(1, std::memory_order_relaxed);
  if (shadow) {
    c.admitted.fetch_add(1, std::memory_order_relaxed);
    o.action = outcome::action::pass;
    return o;
  }
  o.action = outcome::action::refuse;
  o.status = 429;
  add_rate_limit_headers(o.headers, d, r, std::chrono::system_clock::now(), options_.headers);
  const std::int64_t retry = retry_after_seconds(d);
  const std::int64_t retry_ms = retry_after_milliseconds(d);
  // The binding layer (the refusing one) decides the wording, as it decides the header figures.
  bool by_tenant = d.dual_layer && d.binding == layer::tenant && r.tenant;
  const policy& binding = by_tenant ? *r.tenant : r.limit;
  std::string scope = by_tenant ? "tenant " : "";
  if (binding.algorithm == algorithm::fixed_window) {
    o.body =
        refusal_body("quota_exceeded", scope + "quota exhausted; it renews in " + std::to_string(retry) + " s", retry_ms);
  } else if (d.source == decision_source::fail_closed) {
    o.body = refusal_body("backend_unavailable", "rate limiter unavailable, request refused", retry_ms);
  } else {
    o.body = refusal_body("too_many_requests", scope + "rate limit exceeded; retry in " + std::to_string(retry) + " s",
                          retry_ms);
  }
  return o;
}

std::vector<rule_counters> middleware::counters() const {
  std::vector<rule_counters> out;
  out.reserve(options_.rules.size());
  for (std::size_t i = 0; i < options_.rules.size(); ++i) {
    out.push_back({.rule = options_.rules[i].name,
                   .admitted = counters_[i].admitted.load(std::memory_order_relaxed),
                   .refused = counters_[i].refused.load(std::memory_order_relaxed),
                   .backend_errors = counters_[i].backend_errors.load(std::memory_order_relaxed),
                   .invalid = counters_[i].invalid.load(std::memory_order_relaxed),
                   .shadow = options_.enforcement == enforcement::shadow});
  }
  return out;
}

std::string render_prometheus(const std::vector<rule_counters>& counters) {
  std::string out;
  prometheus::family(out, "sluice_middleware_requests_total", "counter",
                     "Requests the HTTP middleware checked, by rule and result.");
  for (const rule_counters& c : counters) {
    const std::string prefix =
        "sluice_middleware_requests_total{rule=\"" + prometheus::escape_label(c.rule) + "\",result=\"";
    // In shadow mode a refusal went on (counted in both): it is shadow_rejected alone.
    const std::uint64_t shadowed = c.shadow ? std::min(c.refused, c.admitted) : 0;
    prometheus::sample(out, prefix + "allowed\"}", c.admitted - shadowed);
    prometheus::sample(out, prefix + "rejected\"}", c.refused - shadowed);
    if (c.shadow) prometheus::sample(out, prefix + "shadow_rejected\"}", shadowed);
    prometheus::sample(out, prefix + "error\"}", c.backend_errors);
    prometheus::sample(out, prefix + "invalid\"}", c.invalid);
  }
  return out;
}

}  // namespace sluice::http
