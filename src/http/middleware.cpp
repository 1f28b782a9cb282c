#include "sluice/http/middleware.hpp"

#include <arpa/inet.h>
#include <openssl/evp.h>


#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

namespace sluice::http {

// --- addresses ----------------------------------------------------------------------------------

namespace {

constexpr std::array<std::uint8_t, 12> v4_mapped_prefix = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
constexpr std::size_t max_hop_bytes = 256;
constexpr int max_hops = 64;

std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool iequals(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

// One hop of X-Forwarded-For or a Forwarded `for=` value: "192.0.2.1", "192.0.2.1:8080",
// "2001:db8::1", "[2001:db8::1]" or "[2001:db8::1]:8080".
std::optional<ip_address> parse_node(std::string_view s) noexcept {
  s = trim(s);
  if (s.empty()) return std::nullopt;
  if (s.front() == '[') {
    auto close = s.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    std::string_view rest = s.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':' || rest.size() < 2 || rest.size() > 6) return std::nullopt;
      for (char c : rest.substr(1)) {
        if (c < '0' || c > '9') return std::nullopt;
      }
    }
    return parse_ip(s.substr(1, close - 1));
  }
  if (auto a = parse_ip(s)) return a;
  // "a.b.c.d:port": exactly one colon, digits after it.
  auto colon = s.find(':');
  if (colon == std::string_view::npos || s.find(':', colon + 1) != std::string_view::npos) return std::nullopt;
  std::string_view port = s.substr(colon + 1);
  if (port.empty() || port.size() > 5) return std::nullopt;
  for (char c : port) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  auto a = parse_ip(s.substr(0, colon));
  if (!a || !a->is_v4()) return std::nullopt;
  return a;
}

// The list element ending at `end` (exclusive) of a comma-separated header, found scanning right to
// left: commas inside quoted strings do not split. Sets `start` to the element's first byte and
// returns false when the element is longer than max_hop_bytes (no proxy writes one that long).
bool previous_element(std::string_view s, std::size_t end, std::size_t& start) noexcept {
  bool quoted = false;
  std::size_t i = end;
  while (i > 0) {
    const char c = s[i - 1];
    if (c == '"' && !(i >= 2 && s[i - 2] == '\\')) {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      break;
    }
    --i;
    if (end - i > max_hop_bytes) return false;
  }
  start = i;
  return !quoted;
}

// The `for` value of one Forwarded element ("for=192.0.2.60;proto=http;by=203.0.113.43"), or
// nullopt when the element is malformed, has no `for`, or it is not an IP address.
std::optional<ip_address> forwarded_for(std::string_view element) {
  std::optional<ip_address> found;
  bool seen = false;
  std::size_t pos = 0;
  while (pos <= element.size()) {
    // One pair, up to the next ';' outside quotes.
    std::size_t end = pos;
    bool quoted = false;
    for (; end < element.size(); ++end) {
      char c = element[end];
      if (quoted) {
        if (c == '\\') ++end;
        else if (c == '"') quoted = false;
      } else if (c == '"') {
        quoted = true;
      } else if (c == ';') {
        break;
      }
    }
    std::string_view pair = trim(element.substr(pos, std::min(end, element.size()) - pos));
    pos = end + 1;
    if (pair.empty()) continue;
    auto eq = pair.find('=');
    if (eq == std::string_view::npos) return std::nullopt;
    std::string_view name = trim(pair.substr(0, eq));
    std::string_view value = trim(pair.substr(eq + 1));
    if (!iequals(name, "for")) continue;
    if (seen) return std::nullopt;  // two `for` in one element: ambiguous
    seen = true;
    std::string unquoted;
    if (!value.empty() && value.front() == '"') {
      if (value.size() < 2 || value.back() != '"') return std::nullopt;
      for (std::size_t i = 1; i + 1 < value.size(); ++i) {
        if (value[i] == '\\' && i + 2 < value.size()) ++i;
        unquoted += value[i];
      }
      value = unquoted;
    }
    found = parse_node(value);
    if (!found) return std::nullopt;
  }
  return found;
}

// Right to left over the hops the trusted proxies appended: the first hop not in `trusted` is the
// client (all trusted: the leftmost). Only the hops up to that one are parsed, so whatever a client
// wrote further left (junk, an open quote, padding, a thousand hops) never matters. nullopt when a
// hop in that part does not parse or there are more than max_hops of them.
template <class HopParser>
std::optional<ip_address> walk_hops(std::string_view header, const std::vector<cidr>& trusted, HopParser parse) {
  std::optional<ip_address> last;
  std::size_t end = header.size();
  for (int hops = 0; hops < max_hops; ++hops) {
    std::size_t start = 0;
    if (!previous_element(header, end, start)) return std::nullopt;
    auto a = parse(header.substr(start, end - start));
    if (!a) return std::nullopt;
    last = a;
    bool is_trusted = std::any_of(trusted.begin(), trusted.end(), [&](const cidr& c) { return c.contains(*a); });
    if (!is_trusted) return a;
    if (start == 0) return last;  // every hop was a trusted proxy
    end = start - 1;              // before the comma
  }
  return std::nullopt;
}

std::optional<ip_address> peer_address(std::string_view peer) {
  if (auto a = parse_ip(peer)) return a;
  return parse_node(peer);  // some servers report "[::1]" or "1.2.3.4:5678"
}

}  // namespace

bool ip_address::is_v4() const noexcept {
  return std::equal(v4_mapped_prefix.begin(), v4_mapped_prefix.end(), bytes.begin());
}

std::optional<ip_address> parse_ip(std::string_view text) noexcept {
  // inet_pton needs a terminated string; the longest textual IPv6 address is 45 characters.
  char buf[64];
  if (text.empty() || text.size() >= sizeof buf || text.find('\0') != std::string_view::npos) return std::nullopt;
  std::memcpy(buf, text.data(), text.size());
  buf[text.size()] = '\0';
  ip_address a;
  if (text.find(':') == std::string_view::npos) {
    std::uint8_t v4[4];
    if (inet_pton(AF_INET, buf, v4) != 1) return std::nullopt;
    std::copy(v4_mapped_prefix.begin(), v4_mapped_prefix.end(), a.bytes.begin());
    std::copy(v4, v4 + 4, a.bytes.begin() + 12);
    return a;
  }
  if (inet_pton(AF_INET6, buf, a.bytes.data()) != 1) return std::nullopt;
  return a;
}

std::string to_string(const ip_address& a) {
  if (a.is_v4()) {  // on every request keyed by IP: cheaper than inet_ntop's printf
    std::string out;
    out.reserve(15);
    for (int i = 12; i < 16; ++i) {
      if (i > 12) out += '.';
      unsigned v = a.bytes[static_cast<std::size_t>(i)];
      if (v >= 100) out += static_cast<char>('0' + v / 100);
      if (v >= 10) out += static_cast<char>('0' + v / 10 % 10);
      out += static_cast<char>('0' + v % 10);
    }
    return out;
  }
  char buf[INET6_ADDRSTRLEN];
  if (!inet_ntop(AF_INET6, a.bytes.data(), buf, sizeof buf)) return {};
  return buf;
}

namespace {

ip_address mask(ip_address a, int prefix) noexcept {
  for (int i = 0; i < 16; ++i) {
    int bits = std::clamp(prefix - i * 8, 0, 8);
    a.bytes[i] &= static_cast<std::uint8_t>(0xff00u >> bits);
  }
  return a;
}

}  // namespace

bool cidr::contains(const ip_address& a) const noexcept {
  // Whole bytes first, then the bits of the last partial byte (`base` is already masked).
  int whole = prefix / 8;
  if (std::memcmp(a.bytes.data(), base.bytes.data(), static_cast<std::size_t>(whole)) != 0) return false;
  int bits = prefix % 8;
  if (bits == 0) return true;
  auto m = static_cast<std::uint8_t>(0xff00u >> bits);
  return (a.bytes[static_cast<std::size_t>(whole)] & m) == base.bytes[static_cast<std::size_t>(whole)];
}

result<cidr> parse_cidr(std::string_view text) {
  std::string_view t = trim(text);
  auto slash = t.find('/');
  auto a = parse_ip(t.substr(0, slash));
  if (!a) return error(errc::invalid_argument, "trusted proxy '" + std::string(text) + "' is not an address or CIDR block");
  int max = a->is_v4() ? 32 : 128;
  int prefix = max;
  if (slash != std::string_view::npos) {
    std::string_view digits = t.substr(slash + 1);
    if (digits.empty() || digits.size() > 3) {
      return error(errc::invalid_argument, "trusted proxy '" + std::string(text) + "' has a bad prefix length");
    }
    prefix = 0;
    for (char c : digits) {
      if (c < '0' || c > '9') {
        return error(errc::invalid_argument, "trusted proxy '" + std::string(text) + "' has a bad prefix length");
      }
      prefix = prefix * 10 + (c - '0');
    }
    if (prefix > max) {
      return error(errc::invalid_argument, "trusted proxy '" + std::string(text) + "' has a prefix longer than " +
                                               std::to_string(max));
    }
  }
  if (a->is_v4()) prefix += 96;
  return cidr{.base = mask(*a, prefix), .prefix = prefix};
}

std::optional<ip_address> client_address(const address_sources& sources, const std::vector<cidr>& trusted,
                                         forwarding_header which) {
  auto peer = sources.peer_ip ? sources.peer_ip : peer_address(sources.peer);
  if (!peer) return std::nullopt;
  bool peer_trusted = std::any_of(trusted.begin(), trusted.end(), [&](const cidr& c) { return c.contains(*peer); });
  if (!peer_trusted) return peer;

  // A trusted proxy that forwards nothing sent the request itself.
  bool is_forwarded = which == forwarding_header::forwarded;
  std::string_view header = trim(is_forwarded ? sources.forwarded : sources.x_forwarded_for);
  if (header.empty()) return peer;
  return is_forwarded ? walk_hops(header, trusted, forwarded_for) : walk_hops(header, trusted, parse_node);
}

// --- routes ---------------------------------------------------------------------------------------

bool path_matches(std::string_view pattern, std::string_view path) noexcept {
  if (pattern == "*") return true;
  if (pattern.size() >= 2 && pattern.ends_with("/*")) {
    std::string_view base = pattern.substr(0, pattern.size() - 2);  // "/notes"
    if (!path.starts_with(base)) return false;
    return path.size() == base.size() || path[base.size()] == '/';
  }
  if (!pattern.empty() && pattern.back() == '*') return path.starts_with(pattern.substr(0, pattern.size() - 1));
  return pattern == path;
}

namespace {

std::string_view path_of(std::string_view target) noexcept {
  auto q = target.find_first_of("?#");
  return q == std::string_view::npos ? target : target.substr(0, q);
}

// A GET route covers HEAD too: servers answer HEAD with their GET handler (cpp-httplib does so on
// its own), so a HEAD must be checked and counted as the GET it runs.
bool method_matches(std::string_view pattern, std::string_view method) noexcept {
  return pattern.empty() || pattern == method || (pattern == "GET" && method == "HEAD");
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

std::string refusal_body(std::string_view code, std::string_view message, std::int64_t retry_after_seconds) {
  return "{\"code\": \"" + json_escape(code) + "\", \"message\": \"" + json_escape(message) +
         "\", \"retry_after\": " + std::to_string(retry_after_seconds) + "}";
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
    bool known = std::any_of(options.rules.begin(), options.rules.end(), [&](const rule& x) { return x.name == r.rule; });
    if (!known) return error(errc::unknown_rule, "middleware: route '" + r.path + "' names unknown rule '" + r.rule + "'");
    if (r.cost <= 0) return error(errc::invalid_argument, "middleware: route '" + r.path + "' has cost <= 0");
  }
  for (const auto& e : options.exempt) {
    if (e.path.empty()) return error(errc::invalid_argument, "middleware: an exempt route has an empty path");
  }
  if (options.ipv6_prefix < 1 || options.ipv6_prefix > 128) {
    return error(errc::invalid_argument, "middleware: ipv6_prefix must be in 1..128, got " + std::to_string(options.ipv6_prefix));
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
  for (const auto& r : options_.routes) {
    auto it = std::find_if(options_.rules.begin(), options_.rules.end(), [&](const rule& x) { return x.name == r.rule; });
    route_rule_.push_back(static_cast<std::size_t>(it - options_.rules.begin()));
    bool keys_on_identity = r.key == key_by::user || r.key == key_by::tenant || r.key == key_by::api_key;
    route_needs_identity_.push_back(keys_on_identity || it->is_dual_layer());
  }
}

const route_limit* middleware::find(std::string_view method, std::string_view target) const noexcept {
  std::string_view path = path_of(target);
  for (const auto& e : options_.exempt) {
    if (method_matches(e.method, method) && path_matches(e.path, path)) return nullptr;
  }
  for (const auto& r : options_.routes) {
    if (method_matches(r.method, method) && path_matches(r.path, path)) return &r;
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
    if (!a->is_v4()) *a = mask(*a, options_.ipv6_prefix);
    return "ip:" + to_string(*a);
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

  if (!answer && answer.error().code != condition::backend_failure) {
    // The check itself cannot be made (cost over the burst, key cap reached, invalid key): that is
    // not an outage, and letting it through would let a request around the limit. Refuse it.
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
    o.headers.push_back({"Retry-After", std::to_string(retry)});
    o.body = transient ? refusal_body("too_many_requests", "rate limiter at capacity, request refused", retry)
                       : refusal_body("not_admissible", "the rate limit cannot admit this request", retry);
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
    o.headers.push_back({"Retry-After", "1"});
    o.body = refusal_body("too_many_requests", "rate limiter unavailable, request refused", 1);
    return o;
  }

  const decision& d = *answer;
  if (d.allowed) {
    c.admitted.fetch_add(1, std::memory_order_relaxed);
    o.action = outcome::action::admit;
    // A fail-open or disabled decision has no figures worth showing.
    if (!shadow && d.source != decision_source::fail_open && d.source != decision_source::disabled) {
      o.headers = rate_limit_headers(d, r, std::chrono::system_clock::now(), options_.headers);
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
  o.headers = rate_limit_headers(d, r, std::chrono::system_clock::now(), options_.headers);
  std::int64_t retry = retry_after_seconds(d);
  // The binding layer (the refusing one) decides the wording, as it decides the header figures.
  bool by_tenant = d.dual_layer && d.binding == layer::tenant && r.tenant;
  const policy& binding = by_tenant ? *r.tenant : r.limit;
  std::string scope = by_tenant ? "tenant " : "";
  if (binding.algorithm == algorithm::fixed_window) {
    o.body = refusal_body("quota_exceeded", scope + "quota exhausted; it renews in " + std::to_string(retry) + " s", retry);
  } else if (d.source == decision_source::fail_closed) {
    o.body = refusal_body("too_many_requests", "rate limiter unavailable, request refused", retry);
  } else {
    o.body = refusal_body("too_many_requests", scope + "rate limit exceeded; retry in " + std::to_string(retry) + " s", retry);
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
                   .invalid = counters_[i].invalid.load(std::memory_order_relaxed)});
  }
  return out;
}

}  // namespace sluice::http
