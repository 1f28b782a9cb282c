// SPDX-License-Identifier: Apache-2.0
// sluice/http/middleware.hpp — rate-limiting middleware for HTTP services, independent of the HTTP
// library.
//
// A `middleware` holds the route table (method + path pattern -> rule, plus exempt routes), derives
// the key of each request (user, tenant + user, API key, tenant, client IP or one global key), asks
// a `sluice::backend` and turns the decision into an `outcome`: go on with these header fields, or
// answer 429 with this JSON body. The Beast (beast.hpp) and cpp-httplib (httplib.hpp) adapters are
// thin layers over it; any other library can use it directly the same way.
//
//   auto mw = sluice::http::middleware::create({
//       .backend = sluice::make_memory_backend({}).value(),   // default options: cannot fail
//       .rules = {{.name = "notes", .limit = sluice::token_bucket_policy(sluice::per_second(5), 60)}},
//       .routes = {{.path = "/notes/*", .rule = "notes", .key = sluice::http::key_by::user}},
//       .exempt = {{.path = "/healthz"}},
//   });
//   const auto* route = (*mw)->find("GET", "/notes/42");
//   auto pending = (*mw)->prepare(*route, {.peer = "10.0.0.7"}, &who);   // who: from your auth
//   sluice::http::outcome o = (*mw)->check(pending);                        // or check_async
//
// Thread-safe: a middleware may serve any number of threads; counters are atomics. A middleware
// lives in a shared_ptr (create() makes it so): an asynchronous check in flight keeps it alive,
// so it may be replaced or dropped at any time.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/backend.hpp"
#include "sluice/decision.hpp"
#include "sluice/error.hpp"
#include "sluice/http/client_address.hpp"
#include "sluice/http/headers.hpp"
#include "sluice/policy.hpp"

namespace sluice::http {

// --- routes and keys ----------------------------------------------------------------------------

/// What a route's requests are keyed on.
enum class key_by : std::uint8_t {
  user,       ///< identity.user ("user:<id>"). For dual-layer rules: identity.tenant + identity.user.
  tenant,     ///< identity.tenant ("tenant:<id>"): one budget per tenant.
  api_key,    ///< identity.api_key ("key:<id>").
  client_ip,  ///< The client address ("ip:<addr>"); IPv6 clients are grouped by `ipv6_prefix`.
  global,     ///< One key for every request of the route ("global").
};

/// What key a route keyed on an identity uses for requests that carry none.
enum class anonymous_key : std::uint8_t {
  client_ip,  ///< Limit anonymous requests per client address.
  global,     ///< All anonymous requests of the route share one key.
};

/// Enforce refusals, or only count them (shadow mode, for rolling out a new rule).
enum class enforcement : std::uint8_t {
  enforce,  ///< Refused requests are answered 429.
  shadow,   ///< Every request goes on; refusals are only counted (`counters.refused`), no headers sent.
};

/// Who sent a request, as the service's own authentication says. Empty fields are unknown.
struct identity {
  std::string user{};     ///< User id. Default: empty.
  std::string tenant{};   ///< Tenant id (dual-layer rules). Default: empty.
  std::string api_key{};  ///< API key id (not the secret). Default: empty.
};

/// A method + path pattern. Path patterns: "/exact"; "/prefix/*" matches "/prefix", "/prefix/" and
/// everything below; "/pre*" matches every path starting with "/pre"; "*" matches everything.
/// The query string is ignored.
struct route_pattern {
  std::string method{};  ///< "GET" (covers HEAD too), "POST", ... exact, case-sensitive; empty = any. Default: empty.
  std::string path{};    ///< The path pattern. Required.
};

/// One row of the route table.
struct route_limit {
  std::string method{};                                ///< As route_pattern::method. Default: empty (any method).
  std::string path{};                                  ///< As route_pattern::path. Required.
  std::string rule{};                                  ///< Name of a rule in `middleware_options::rules`. Required.
  key_by key = key_by::user;                           ///< Default: user.
  anonymous_key anonymous = anonymous_key::client_ip;  ///< Default: client_ip.
  std::int64_t cost = 1;                               ///< Units per request. Default: 1.
};

struct middleware_options {
  /// Where limiter state lives (memory, Redis, ...). Required.
  std::shared_ptr<sluice::backend> backend{};
  /// The rules the routes name. Names must be unique. Default: none.
  std::vector<sluice::rule> rules{};
  /// The route table; the first matching row applies. Unmatched requests go on unlimited. Default: none.
  std::vector<route_limit> routes{};
  /// Routes never limited (health, metrics); checked before `routes`. Default: none.
  std::vector<route_pattern> exempt{};
  /// CIDR blocks of proxies whose forwarding header is believed. Default: none (the client address
  /// is always the TCP peer).
  std::vector<std::string> trusted_proxies{};
  /// The header the trusted proxies write. Default: X-Forwarded-For.
  forwarding_header client_ip_header = forwarding_header::x_forwarded_for;
  /// IPv6 clients are keyed by this many leading bits (one /64 is usually one subscriber).
  /// 1..128. Default: 64.
  int ipv6_prefix = 64;
  /// Default: enforce.
  sluice::http::enforcement enforcement = enforcement::enforce;
  /// What to do when the backend fails (errc::backend_unavailable, backend_timeout,
  /// backend_protocol, backend_overloaded: a remote backend without its own on_error fallback):
  /// allow = let the request go on without headers; deny = answer 429. `local` is treated as
  /// allow. Any other error means the check itself cannot be made (cost over the burst, a key cap
  /// reached, an invalid key): that request is always refused with 429, whatever `on_error` says,
  /// so it never becomes a way around the limit. The middleware never answers 500. Default: allow.
  failure_policy on_error = failure_policy::allow;
  /// Which header fields to send. Default: X-RateLimit-* only.
  header_options headers{};
};

/// Per-rule counters, a snapshot.
struct rule_counters {
  std::string rule{};
  std::uint64_t admitted = 0;        ///< Requests that went on (including fail-open and shadow-refused).
  std::uint64_t refused = 0;         ///< Requests the limiter refused (in shadow mode: would have).
  std::uint64_t backend_errors = 0;  ///< Backend failures, handled by `on_error`.
  std::uint64_t invalid = 0;         ///< Checks the backend could not make (not a backend failure);
                                     ///< also counted in `refused`.
  bool shadow = false;               ///< Counted in shadow mode: the refused went on.
};

/// What the HTTP layer does with a request.
struct outcome {
  enum class action : std::uint8_t {
    pass,    ///< Not limited (exempt, unmatched): go on, add nothing.
    admit,   ///< Go on and add `headers` to the response.
    refuse,  ///< Answer `status` with `headers` and `body` (JSON); do not run the handler.
  };
  outcome::action action = action::pass;
  header_fields headers{};
  int status = 200;    ///< 429 when refused.
  std::string body{};  ///< JSON when refused: {"error": {"code": ..., "message": ...}, "retry_after_ms": N}.
};

class middleware;

namespace detail {
/// The common methods as small numbers, so that a route row's method is one compare: any_method
/// for none (a row for any method), other_method for the rest, compared as text.
inline constexpr std::uint8_t any_method = 0, get_code = 1, head_code = 2, other_method = 255;
inline std::uint8_t method_code(std::string_view m) noexcept {
  switch (m.size()) {
    case 0: return any_method;
    case 3: return m == "GET" ? get_code : m == "PUT" ? 3 : other_method;
    case 4: return m == "HEAD" ? head_code : m == "POST" ? 4 : other_method;
    case 5: return m == "PATCH" ? 5 : other_method;
    case 6: return m == "DELETE" ? 6 : other_method;
    case 7: return m == "OPTIONS" ? 7 : other_method;
    default: return other_method;
  }
}

/// A route table row's method and path pattern, parsed once: find() runs on every request.
struct compiled_route {
  enum class kind : std::uint8_t { exact, any, below, prefix };
  std::string_view method{};     ///< Empty: any.
  std::string_view base{};       ///< The path; for below ("/x/*") and prefix ("/x*"), the part before.
  std::uint8_t method_code = 0;  ///< method_code(method).
  kind path_kind = kind::exact;
  const route_limit* route = nullptr;  ///< Null for an exempt row.
};
compiled_route compile_route(std::string_view method, std::string_view path, const route_limit* route) noexcept;

// Two short strings equal? The last bytes first: most rows differ there, and the call to memcmp
// that operator== makes costs more than the rest of a row's test.
inline bool same_text(std::string_view a, std::string_view b) noexcept {
  return a.size() == b.size() && (a.empty() || (a.back() == b.back() && a == b));
}

/// Whether row `c` covers a request of `method` (whose method_code is `code`) for `path`.
inline bool route_matches(const compiled_route& c, std::string_view method, std::uint8_t code,
                          std::string_view path) noexcept {
  // A GET route covers HEAD too: servers answer HEAD with their GET handler (cpp-httplib does so on
  // its own), so a HEAD must be checked and counted as the GET it runs.
  if (c.method_code != any_method && c.method_code != code && !(code == head_code && c.method_code == get_code)) {
    return false;
  }
  if (c.method_code == other_method && c.method != method) return false;
  switch (c.path_kind) {
    case compiled_route::kind::exact: return same_text(path, c.base);
    case compiled_route::kind::any: return true;
    case compiled_route::kind::below:
      return path.size() >= c.base.size() && same_text(path.substr(0, c.base.size()), c.base) &&
             (path.size() == c.base.size() || path[c.base.size()] == '/');
    case compiled_route::kind::prefix:
      return path.size() >= c.base.size() && same_text(path.substr(0, c.base.size()), c.base);
  }
  return false;
}
}  // namespace detail

/// One request's check, ready to go to the backend. Owns the key strings the request views, so
/// for check_async() it must stay where it is (the middleware holds it in a shared_ptr).
class pending_check {
 public:
  /// The backend request; its views point into this object.
  check_request request() const noexcept {
    return {.rule = prepared_, .key = key_, .tenant = tenant_, .user = user_, .cost = cost_};
  }
  /// The rule checked.
  const sluice::rule& rule() const noexcept { return prepared_->definition(); }

 private:
  friend class middleware;
  pending_check() = default;

  const prepared_rule* prepared_ = nullptr;  // held by the middleware
  std::size_t rule_index_ = 0;
  std::int64_t cost_ = 1;
  std::string key_;
  std::string tenant_;
  std::string user_;
};

class middleware : public std::enable_shared_from_this<middleware> {
  struct private_tag {
    explicit private_tag() = default;
  };

 public:
  /// Validates the options (rules, unique names, routes naming known rules, CIDRs, ipv6_prefix).
  static result<std::shared_ptr<middleware>> create(middleware_options options);

  middleware(const middleware&) = delete;  // its route table views its own options
  middleware& operator=(const middleware&) = delete;

  /// The route row for a request, or nullptr when the request is exempt or unmatched.
  /// `target` may carry a query string.
  const route_limit* find(std::string_view method, std::string_view target) const noexcept;

  /// True when the service's identity callback is needed for `route` (a row find() returned): it
  /// keys on an identity, or its rule is dual-layer (the tenant layer uses identity.tenant).
  bool needs_identity(const route_limit& route) const noexcept;

  /// Derives the key(s) of a request of `route`, a row find() returned. `who` may be null
  /// (anonymous). Keys are "user:<id>", "tenant:<id>", "key:<id>", "ip:<address>", "global", or
  /// "anonymous" (anonymous_key::global). An id too long for such a key (over `max_key_length`
  /// with its prefix) is keyed on its digest instead: "user#", "tenant#" or "key#" and the first
  /// 128 bits of its SHA-256 in lowercase hex, so it is limited like any other id.
  /// Dual-layer rules: the tenant layer is "tenant:<who->tenant>" whenever the identity names a
  /// tenant, whatever the route keys on; only callers without one share the "anonymous" tenant.
  pending_check prepare(const route_limit& route, const address_sources& from, const identity* who) const;

  /// True when `peer` is in `trusted_proxies` (adapters read the forwarding header only then).
  bool is_trusted_proxy(const ip_address& peer) const noexcept;

  /// True when the backend answers in process (the memory backend): check() then never waits on
  /// I/O, so asynchronous adapters call it directly instead of going through check_async().
  bool completes_inline() const noexcept { return completes_inline_; }

  /// Blocking check (for thread-per-request servers such as cpp-httplib).
  outcome check(const pending_check& pending);

  /// Asynchronous check: `done` runs once, inline or on the backend's thread. The check holds a
  /// reference to this middleware until `done` has run, so dropping the middleware meanwhile is
  /// safe.
  void check_async(pending_check pending, std::function<void(outcome)> done);

  /// Turns a backend answer into an outcome and counts it. check() and check_async() call it.
  outcome complete(const pending_check& pending, const result<decision>& answer);

  /// A snapshot of the per-rule counters, in rule order.
  std::vector<rule_counters> counters() const;

  /// The options in force (after validation).
  const middleware_options& options() const noexcept { return options_; }

  /// Use create(): a middleware must live in a shared_ptr.
  middleware(private_tag, middleware_options options, std::vector<cidr> trusted,
             std::vector<prepared_rule_ptr> prepared);

 private:
  struct atomic_counters {
    std::atomic<std::uint64_t> admitted{0};
    std::atomic<std::uint64_t> refused{0};
    std::atomic<std::uint64_t> backend_errors{0};
    std::atomic<std::uint64_t> invalid{0};
  };

  middleware_options options_;
  std::vector<cidr> trusted_;
  std::vector<prepared_rule_ptr> prepared_;    // options_.rules[i] as the backend prepared it
  std::vector<detail::compiled_route> table_;  // exempt rows, then routes; views of options_
  std::vector<std::size_t> route_rule_;        // routes_[i] -> index into options_.rules
  std::vector<bool> route_needs_identity_;     // routes_[i] -> needs_identity()
  std::unique_ptr<atomic_counters[]> counters_;
  bool completes_inline_ = false;
};

/// The per-rule counters in the Prometheus text format (sluice/prometheus.hpp), for a service's own
/// /metrics route: `sluice_middleware_requests_total{rule, result}` with result allowed, rejected,
/// error or invalid (invalid requests are also counted as rejected): the words of sluiced's
/// `sluice_checks_total`. In shadow mode the refusals that went on are `shadow_rejected`, as a
/// sluiced shadow rule's are, and not among the allowed.
std::string render_prometheus(const std::vector<rule_counters>& counters);

/// The JSON body of a refusal, in the shape and units of sluiced's answers:
/// {"error": {"code": code, "message": message}, "retry_after_ms": milliseconds}.
std::string refusal_body(std::string_view code, std::string_view message, std::int64_t retry_after_ms);

/// True when `path` (no query string) matches the pattern (see route_pattern).
bool path_matches(std::string_view pattern, std::string_view path) noexcept;

}  // namespace sluice::http
