// SPDX-License-Identifier: Apache-2.0
// Unit tests of the library-neutral middleware: routes, keys, client addresses, outcomes.
// No sockets; the backend is a scripted fake.
#include "sluice/http/middleware.hpp"

#include <gtest/gtest.h>

#include "sluice/memory_backend.hpp"
#include "sluice/testing/simulated_clock.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <deque>
#include <random>
#include <string>

namespace {

using namespace sluice;
using namespace sluice::http;
using namespace std::chrono_literals;

// Answers each check with the next scripted result (default: admitted, limit 60, remaining 59) and
// remembers what was asked.
class fake_backend : public backend {
 public:
  result<decision> decide(const check_request& req) override {
    asked.push_back(
        {std::string(req.key), std::string(req.tenant), std::string(req.user), req.definition().name, req.cost});
    if (script.empty()) return decision{.allowed = true, .limit = 60, .remaining = 59, .reset_after = 200ms};
    auto r = script.front();
    script.pop_front();
    return r;
  }
  void async_decide(const check_request& req, check_handler handler) override { handler(decide(req)); }
  result<std::vector<decision>> decide_all(std::span<const check_request>) override {
    return error(errc::invalid_argument, "the middleware makes single checks");
  }
  void async_decide_all(std::span<const check_request> c, check_all_handler h) override { h(decide_all(c)); }
  bool ready() override { return true; }

  struct asked_check {
    std::string key, tenant, user, rule;
    std::int64_t cost;
  };
  std::vector<asked_check> asked;
  std::deque<result<decision>> script;
};

struct middleware_test : ::testing::Test {
  std::shared_ptr<fake_backend> fake = std::make_shared<fake_backend>();

  middleware_options options() {
    return {
        .backend = fake,
        .rules = {{.name = "notes", .limit = token_bucket_policy(per_second(5), 60), .tenant = std::nullopt},
                  {.name = "quota", .limit = fixed_window_policy(10, 24h), .tenant = std::nullopt},
                  {.name = "dual",
                   .limit = token_bucket_policy(per_second(5), 60),
                   .tenant = token_bucket_policy(per_second(1), 100)},
                  {.name = "ip", .limit = token_bucket_policy(per_second(5), 60), .tenant = std::nullopt}},
        .routes = {{.method = "GET", .path = "/notes/export", .rule = "quota"},
                   {.path = "/notes/*", .rule = "notes", .cost = 2},
                   {.path = "/tenant*", .rule = "dual"},
                   {.method = "GET", .path = "/public", .rule = "ip", .key = key_by::client_ip},
                   {.path = "/keys", .rule = "ip", .key = key_by::api_key, .anonymous = anonymous_key::global},
                   {.path = "/all", .rule = "ip", .key = key_by::global}},
        .exempt = {{.path = "/notes/health"}, {.method = "OPTIONS", .path = "*"}},
        .trusted_proxies = {"10.0.0.0/8", "2001:db8:ffff::/48"},
    };
  }
  std::shared_ptr<middleware> make(middleware_options o) {
    auto m = middleware::create(std::move(o));
    EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().message);
    return m.ok() ? *m : nullptr;
  }
  // Runs one request through find/prepare/check.
  outcome run(middleware& m, std::string_view method, std::string_view target, const identity* who,
              address_sources from = {.peer = "192.0.2.1"}) {
    const route_limit* r = m.find(method, target);
    if (!r) return {};
    return m.check(m.prepare(*r, from, who));
  }
};

TEST(PathMatches, Patterns) {
  EXPECT_TRUE(path_matches("/notes", "/notes"));
  EXPECT_FALSE(path_matches("/notes", "/notes/1"));
  EXPECT_FALSE(path_matches("/notes", "/note"));
  EXPECT_TRUE(path_matches("/notes/*", "/notes"));
  EXPECT_TRUE(path_matches("/notes/*", "/notes/"));
  EXPECT_TRUE(path_matches("/notes/*", "/notes/1/2"));
  EXPECT_FALSE(path_matches("/notes/*", "/notesx"));
  EXPECT_FALSE(path_matches("/notes/*", "/note"));
  EXPECT_TRUE(path_matches("/pre*", "/prefix"));
  EXPECT_TRUE(path_matches("/pre*", "/pre"));
  EXPECT_FALSE(path_matches("/pre*", "/pr"));
  EXPECT_TRUE(path_matches("*", "/anything"));
  EXPECT_TRUE(path_matches("*", ""));
  EXPECT_FALSE(path_matches("", "/"));
}

TEST_F(middleware_test, FindHonoursOrderMethodExemptAndQuery) {
  auto m = make(options());
  ASSERT_TRUE(m);
  EXPECT_EQ(m->find("GET", "/notes/export")->rule, "quota");
  EXPECT_EQ(m->find("POST", "/notes/export")->rule, "notes");  // method mismatch: next row
  EXPECT_EQ(m->find("GET", "/notes?x=1")->rule, "notes");
  EXPECT_EQ(m->find("GET", "/public?a=/notes")->rule, "ip");
  EXPECT_EQ(m->find("POST", "/public"), nullptr);
  EXPECT_EQ(m->find("GET", "/notes/health"), nullptr);  // exempt wins over /notes/*
  EXPECT_EQ(m->find("OPTIONS", "/notes/1"), nullptr);
  EXPECT_EQ(m->find("GET", "/elsewhere"), nullptr);
  EXPECT_EQ(m->find("GET", ""), nullptr);
  // HEAD runs the GET handler: a GET row covers it; other methods do not.
  EXPECT_EQ(m->find("HEAD", "/notes/export")->rule, "quota");
  EXPECT_EQ(m->find("HEAD", "/public")->rule, "ip");
  EXPECT_EQ(m->find("PUT", "/public"), nullptr);
}

// Methods are case-sensitive tokens; ones the route table has no code for are compared as text.
TEST_F(middleware_test, FindComparesOtherMethodsAsText) {
  middleware_options o = options();
  o.exempt.clear();
  o.routes = {{.method = "PURGE", .path = "/cache/*", .rule = "ip"},
              {.method = "GET", .path = "/cache/*", .rule = "notes"}};
  auto m = make(std::move(o));
  ASSERT_TRUE(m);
  EXPECT_EQ(m->find("PURGE", "/cache/x")->rule, "ip");
  EXPECT_EQ(m->find("MERGE", "/cache/x"), nullptr);  // as long, another method
  EXPECT_EQ(m->find("purge", "/cache/x"), nullptr);
  EXPECT_EQ(m->find("get", "/cache/x"), nullptr);
  EXPECT_EQ(m->find("GET", "/cache#frag")->rule, "notes");
  EXPECT_EQ(m->find("GETS", "/cache"), nullptr);
}

TEST_F(middleware_test, UnresolvableClientSharesOneKeyNotTheProxys) {
  auto m = make(options());
  ASSERT_TRUE(m);
  (void)run(*m, "GET", "/public", nullptr, {.peer = "10.0.0.1", .x_forwarded_for = "1.2.3.4, junk"});
  (void)run(*m, "GET", "/public", nullptr, {.peer = "10.0.0.1", .x_forwarded_for = "\"x, 198.51.100.9"});
  (void)run(*m, "GET", "/public", nullptr, {.peer = "10.0.0.1"});
  ASSERT_EQ(fake->asked.size(), 3u);
  EXPECT_EQ(fake->asked[0].key, unresolved_client_key);
  EXPECT_EQ(fake->asked[1].key, "ip:198.51.100.9");
  EXPECT_EQ(fake->asked[2].key, "ip:10.0.0.1");  // the proxy's own request
}

TEST_F(middleware_test, CreateRejectsBadOptions) {
  auto o = options();
  o.routes.push_back({.path = "/x", .rule = "nope"});
  EXPECT_FALSE(middleware::create(o).ok());
  o = options();
  o.trusted_proxies.push_back("10.0.0.0/33");
  EXPECT_FALSE(middleware::create(o).ok());
  o = options();
  o.trusted_proxies.push_back("not-an-ip");
  EXPECT_FALSE(middleware::create(o).ok());
  o = options();
  o.rules.push_back(o.rules.front());
  EXPECT_FALSE(middleware::create(o).ok());
  o = options();
  o.backend = nullptr;
  EXPECT_FALSE(middleware::create(o).ok());
  o = options();
  o.ipv6_prefix = 0;
  EXPECT_FALSE(middleware::create(o).ok());
  o = options();
  o.routes[0].cost = 0;
  EXPECT_FALSE(middleware::create(o).ok());
}

TEST_F(middleware_test, KeysByUserTenantApiKeyIpAndGlobal) {
  auto m = make(options());
  identity alice{.user = "alice", .tenant = "acme", .api_key = "k1"};
  (void)run(*m, "GET", "/notes", &alice);
  (void)run(*m, "GET", "/notes", nullptr);  // anonymous: per client IP
  (void)run(*m, "GET", "/tenant/x", &alice);
  (void)run(*m, "GET", "/tenant/x", nullptr);
  (void)run(*m, "GET", "/keys", &alice);
  (void)run(*m, "GET", "/keys", nullptr);  // anonymous_key::global
  (void)run(*m, "GET", "/all", &alice);
  (void)run(*m, "GET", "/public", &alice, {.peer = "2001:db8:1:2:3:4:5:6"});
  identity no_tenant{.user = "bob"};
  (void)run(*m, "GET", "/tenant/x", &no_tenant);  // dual layer needs both: anonymous

  ASSERT_EQ(fake->asked.size(), 9u);
  EXPECT_EQ(fake->asked[0].key, "user:alice");
  EXPECT_EQ(fake->asked[0].cost, 2);
  EXPECT_EQ(fake->asked[1].key, "ip:192.0.2.1");
  EXPECT_EQ(fake->asked[2].tenant, "tenant:acme");
  EXPECT_EQ(fake->asked[2].user, "user:alice");
  EXPECT_EQ(fake->asked[2].key, "");
  EXPECT_EQ(fake->asked[3].tenant, "anonymous");
  EXPECT_EQ(fake->asked[3].user, "ip:192.0.2.1");
  EXPECT_EQ(fake->asked[4].key, "key:k1");
  EXPECT_EQ(fake->asked[5].key, "anonymous");
  EXPECT_EQ(fake->asked[6].key, "global");
  EXPECT_EQ(fake->asked[7].key, "ip:2001:db8:1:2::");  // grouped by /64
  EXPECT_EQ(fake->asked[8].tenant, "anonymous");
}

TEST(ClientAddress, ParsesAndCanonicalises) {
  EXPECT_EQ(to_string(*parse_ip("192.0.2.1")), "192.0.2.1");
  EXPECT_EQ(to_string(*parse_ip("::ffff:192.0.2.1")), "192.0.2.1");
  EXPECT_EQ(*parse_ip("::ffff:192.0.2.1"), *parse_ip("192.0.2.1"));
  EXPECT_EQ(to_string(*parse_ip("2001:DB8:0:0:0:0:0:1")), "2001:db8::1");
  for (const char* bad :
       {"", " 1.2.3.4", "1.2.3", "1.2.3.4.5", "256.1.1.1", "1.2.3.4:80", "[::1]", "::1%lo", "x", "::g"}) {
    EXPECT_FALSE(parse_ip(bad)) << bad;
  }
  EXPECT_TRUE(parse_cidr("10.0.0.0/8")->contains(*parse_ip("10.255.1.2")));
  // IPv4 is parsed without inet_pton: it accepts exactly what inet_pton does, to the same bytes.
  std::mt19937 rng(11);
  const std::string alphabet = "0123456789...25 x";
  std::vector<std::string> cases = {"0.0.0.0",    "255.255.255.255", "01.2.3.4", "1.2.3.04",
                                    "1.2.3.256",  "1..2.3",          "1.2.3.",   ".1.2.3",
                                    "1234.1.1.1", "1.2.3.4 ",        "0.0.0.00", std::string("1.2.3.4\0", 8)};
  for (int i = 0; i < 20000; ++i) {
    std::string s;
    for (std::size_t n = rng() % 16; n > 0; --n) s += alphabet[rng() % alphabet.size()];
    cases.push_back(s);
  }
  for (const std::string& c : cases) {
    std::uint8_t want[4];
    const bool ok = c.find('\0') == std::string::npos && inet_pton(AF_INET, c.c_str(), want) == 1;
    auto got = parse_ip(c);
    ASSERT_EQ(got.has_value(), ok) << "\"" << c << "\"";
    if (ok) EXPECT_TRUE(std::equal(want, want + 4, got->bytes.begin() + 12)) << c;
  }
  EXPECT_FALSE(parse_cidr("10.0.0.0/8")->contains(*parse_ip("11.0.0.1")));
  EXPECT_TRUE(parse_cidr("10.1.2.3/8")->contains(*parse_ip("10.9.9.9")));  // host bits masked
  EXPECT_TRUE(parse_cidr("0.0.0.0/0")->contains(*parse_ip("8.8.8.8")));
  EXPECT_FALSE(parse_cidr("0.0.0.0/0")->contains(*parse_ip("2001:db8::1")));
  EXPECT_TRUE(parse_cidr("::/0")->contains(*parse_ip("8.8.8.8")));
  EXPECT_TRUE(parse_cidr("127.0.0.1")->contains(*parse_ip("127.0.0.1")));
  EXPECT_FALSE(parse_cidr("127.0.0.1")->contains(*parse_ip("127.0.0.2")));
  // Every prefix length, against a bit-by-bit reading of the definition, on addresses that share
  // the block's first bits up to a random point.
  for (int i = 0; i < 20000; ++i) {
    ip_address base, a;
    for (auto& b : base.bytes) b = static_cast<std::uint8_t>(rng());
    const int prefix = static_cast<int>(rng() % 129), same = static_cast<int>(rng() % 129);
    const cidr block{masked(base, prefix), prefix};
    for (int bit = 0; bit < 128; ++bit) {
      const auto byte = static_cast<std::size_t>(bit / 8);
      const auto mask = static_cast<std::uint8_t>(0x80 >> (bit % 8));
      const bool one = bit < same ? (block.base.bytes[byte] & mask) != 0 : (rng() & 1) != 0;
      if (one) a.bytes[byte] = static_cast<std::uint8_t>(a.bytes[byte] | mask);
    }
    bool want = true;
    for (int bit = 0; bit < prefix; ++bit) {
      const auto byte = static_cast<std::size_t>(bit / 8);
      const auto mask = static_cast<std::uint8_t>(0x80 >> (bit % 8));
      if ((a.bytes[byte] & mask) != (block.base.bytes[byte] & mask)) want = false;
    }
    ASSERT_EQ(block.contains(a), want) << to_string(block.base) << "/" << prefix << " " << to_string(a);
  }
  for (const char* bad :
       {"", "/8", "10.0.0.0/", "10.0.0.0/x", "10.0.0.0/-1", "10.0.0.0/33", "::/129", "10.0.0.0/0008"}) {
    EXPECT_FALSE(parse_cidr(bad).ok()) << bad;
  }
}

struct client_address_test : ::testing::Test {
  std::vector<cidr> trusted{*parse_cidr("10.0.0.0/8"), *parse_cidr("2001:db8:ffff::/48")};
  // X-Forwarded-For mode (the default).
  std::string of(std::string_view peer, std::string_view xff, std::string_view fwd = {}) {
    auto a = client_address({.peer = peer, .forwarded = fwd, .x_forwarded_for = xff}, trusted);
    return a ? to_string(*a) : "none";
  }
  // Forwarded mode.
  std::string fwd(std::string_view peer, std::string_view forwarded, std::string_view xff = {}) {
    auto a = client_address({.peer = peer, .forwarded = forwarded, .x_forwarded_for = xff}, trusted,
                            forwarding_header::forwarded);
    return a ? to_string(*a) : "none";
  }
};

TEST_F(client_address_test, UntrustedPeerHeadersIgnored) {
  EXPECT_EQ(of("192.0.2.1", "198.51.100.1"), "192.0.2.1");
  EXPECT_EQ(of("192.0.2.1", "", "for=198.51.100.1"), "192.0.2.1");
  EXPECT_EQ(of("::ffff:192.0.2.1", "198.51.100.1"), "192.0.2.1");
}

TEST_F(client_address_test, TrustedPeerXffWalkedRightToLeft) {
  EXPECT_EQ(of("10.0.0.1", "198.51.100.1"), "198.51.100.1");
  EXPECT_EQ(of("10.0.0.1", "203.0.113.9, 198.51.100.1"), "198.51.100.1");  // client-prepended value ignored
  EXPECT_EQ(of("10.0.0.1", "198.51.100.1, 10.0.0.2, 10.0.0.3"), "198.51.100.1");
  EXPECT_EQ(of("10.0.0.1", "10.0.0.9, 10.0.0.2"), "10.0.0.9");  // all trusted: leftmost
  EXPECT_EQ(of("10.0.0.1", " 198.51.100.1:8080 "), "198.51.100.1");
  EXPECT_EQ(of("10.0.0.1", "[2001:db8::7]:443"), "2001:db8::7");
  EXPECT_EQ(of("10.0.0.1", "2001:db8::7"), "2001:db8::7");
  EXPECT_EQ(of("2001:db8:ffff::1", "198.51.100.1"), "198.51.100.1");
  EXPECT_EQ(of("10.0.0.1", ""), "10.0.0.1");
  // Garbage to the left of the client is never reached.
  EXPECT_EQ(of("10.0.0.1", "garbage, 198.51.100.1"), "198.51.100.1");
}

TEST_F(client_address_test, TrustedPeerForwarded) {
  EXPECT_EQ(fwd("10.0.0.1", "for=198.51.100.1"), "198.51.100.1");
  EXPECT_EQ(fwd("10.0.0.1", "for=198.51.100.1;proto=https;by=10.0.0.1"), "198.51.100.1");
  EXPECT_EQ(fwd("10.0.0.1", "For=\"[2001:db8::1]:4711\""), "2001:db8::1");
  EXPECT_EQ(fwd("10.0.0.1", "for=203.0.113.5, for=198.51.100.1, for=10.0.0.2"), "198.51.100.1");
  EXPECT_EQ(fwd("10.0.0.1", "for=\"198.51.100.1;x\"; proto=http"), "none");  // not an address
  EXPECT_EQ(fwd("10.0.0.1", "proto=http;by=\"a,b\", for=198.51.100.1"), "198.51.100.1");
  EXPECT_EQ(fwd("192.0.2.1", "for=198.51.100.1"), "192.0.2.1");  // untrusted peer
}

TEST_F(client_address_test, OnlyTheConfiguredHeaderIsRead) {
  // A proxy that writes X-Forwarded-For passes a client's own Forwarded header on untouched.
  EXPECT_EQ(of("10.0.0.1", "", "for=198.51.100.1"), "10.0.0.1");
  EXPECT_EQ(of("10.0.0.1", "203.0.113.1", "for=198.51.100.1"), "203.0.113.1");
  EXPECT_EQ(fwd("10.0.0.1", "", "198.51.100.1"), "10.0.0.1");
  EXPECT_EQ(fwd("10.0.0.1", "for=203.0.113.1", "198.51.100.1"), "203.0.113.1");
}

// What the proxy appended is all that is parsed: the client's own part is never reached.
TEST_F(client_address_test, ClientWrittenPrefixIsNeverParsed) {
  std::string junk_hops, trusted_hops;
  for (int i = 0; i < 64; ++i) junk_hops += "junk" + std::to_string(i) + ", ";
  for (const std::string& prefix : {std::string("\"x"), junk_hops, std::string(9000, ' ') + "pad", std::string("["),
                                    std::string("\xff\xfe"), std::string(3000, ',')}) {
    EXPECT_EQ(of("10.0.0.1", prefix + ", 198.51.100.1"), "198.51.100.1") << "prefix '" << prefix.substr(0, 20) << "'";
    EXPECT_EQ(of("10.0.0.1", prefix + ", 198.51.100.1, 10.0.0.2"), "198.51.100.1");
    EXPECT_EQ(fwd("10.0.0.1", prefix + ", for=198.51.100.1"), "198.51.100.1");
  }
  EXPECT_EQ(fwd("10.0.0.1", "for=\"x, for=198.51.100.1"), "198.51.100.1");
}

// No client can be found: nullopt, never the proxy's address (the middleware keys on ip:unresolved).
TEST_F(client_address_test, HostileHeadersResolveToNoClient) {
  for (const std::string& h : std::vector<std::string>{"garbage",
                                                       ",",
                                                       ",,,",
                                                       "[",
                                                       "[::1",
                                                       "[::1]x",
                                                       "[::1]:",
                                                       "[::1]:1234567",
                                                       "1.2.3.4:",
                                                       "1.2.3.4:x",
                                                       "1.2.3.4:123456",
                                                       "999.1.1.1",
                                                       "unknown",
                                                       "_hidden",
                                                       "\"",
                                                       "\"1.2.3.4\"",
                                                       "1.2.3.4 5.6.7.8",
                                                       "::1%eth0",
                                                       std::string("1.2.3.4\0", 8),
                                                       "\xff\xfe",
                                                       "1.2.3.4, ",
                                                       " , 1.2.3.4,"}) {
    EXPECT_EQ(of("10.0.0.1", h), "none") << "xff '" << h << "'";
  }
  for (const std::string& h :
       std::vector<std::string>{"garbage", "1.2.3.4", "for", "for=", "for=unknown", "for=_hidden", "for=\"",
                                "for=\"[::1\"", "for=1.2.3.4;for=5.6.7.8", "for=\"a\\\"", "=1.2.3.4", "for==1.2.3.4",
                                "by=1.2.3.4", "for=1.2.3.4,", "\"for=1.2.3.4"}) {
    EXPECT_EQ(fwd("10.0.0.1", h), "none") << "forwarded '" << h << "'";
  }
  EXPECT_EQ(of("10.0.0.1", std::string(9000, '1')), "none");  // one hop over 256 bytes
  std::string many = "198.51.100.1";
  for (int i = 0; i < 100; ++i) many += ", 10.0.0." + std::to_string(i % 250);
  EXPECT_EQ(of("10.0.0.1", many), "none");  // more than 64 trusted hops before the client
  EXPECT_EQ(of("not an address", "198.51.100.1"), "none");
}

TEST_F(client_address_test, RandomBytesNeverCrash) {
  std::mt19937 rng(12345);
  const std::string alphabet = "0123456789abcdef.:[]\",; =forFOR\\_-x\t\x01\xff";
  for (int i = 0; i < 20000; ++i) {
    std::string h(rng() % 80, ' ');
    for (auto& c : h) c = alphabet[rng() % alphabet.size()];
    auto a = client_address({.peer = "10.0.0.1", .forwarded = h, .x_forwarded_for = h}, trusted,
                            (i % 2) ? forwarding_header::forwarded : forwarding_header::x_forwarded_for);
    if (a) ASSERT_FALSE(to_string(*a).empty());
  }
}

TEST_F(middleware_test, AdmittedOutcomeCarriesHeaders) {
  auto m = make(options());
  identity alice{.user = "alice"};
  outcome o = run(*m, "GET", "/notes", &alice);
  EXPECT_EQ(o.action, outcome::action::admit);
  ASSERT_EQ(o.headers.size(), 3u);
  EXPECT_EQ(o.headers[0].name, "X-RateLimit-Limit");
  EXPECT_EQ(o.headers[0].value, "60");
  EXPECT_EQ(o.headers[1].value, "59");
}

TEST_F(middleware_test, RefusalBodiesAndCodes) {
  auto m = make(options());
  identity alice{.user = "alice", .tenant = "acme"};
  decision refused{.allowed = false, .limit = 60, .remaining = 0, .retry_after = 1500ms, .reset_after = 12s};
  fake->script.push_back(refused);
  outcome o = run(*m, "GET", "/notes", &alice);
  EXPECT_EQ(o.action, outcome::action::refuse);
  EXPECT_EQ(o.status, 429);
  EXPECT_EQ(
      o.body,
      "{\"error\": {\"code\": \"too_many_requests\", \"message\": \"rate limit exceeded; retry in 2 s\"}, "
      "\"retry_after_ms\": 1500}");
  bool retry_after = false;
  for (const auto& h : o.headers) retry_after |= h.name == "Retry-After" && h.value == "2";
  EXPECT_TRUE(retry_after);

  fake->script.push_back(decision{.allowed = false, .limit = 10, .retry_after = 3600s, .reset_after = 3600s});
  o = run(*m, "GET", "/notes/export", &alice);
  EXPECT_NE(o.body.find("\"code\": \"quota_exceeded\""), std::string::npos) << o.body;
  EXPECT_NE(o.body.find("\"retry_after_ms\": 3600000"), std::string::npos) << o.body;

  fake->script.push_back(decision{.allowed = false,
                                  .limit = 100,
                                  .retry_after = 1s,
                                  .dual_layer = true,
                                  .rejected_by = layer::tenant,
                                  .binding = layer::tenant});
  o = run(*m, "GET", "/tenant", &alice);
  EXPECT_NE(o.body.find("tenant rate limit exceeded"), std::string::npos) << o.body;

  auto c = m->counters();
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c[0].rule, "notes");
  EXPECT_EQ(c[0].refused, 1u);
  EXPECT_EQ(c[1].refused, 1u);
  EXPECT_EQ(c[2].refused, 1u);
  EXPECT_EQ(c[0].admitted, 0u);
}

TEST_F(middleware_test, BackendErrorsFollowOnError) {
  auto m = make(options());
  fake->script.push_back(error(errc::backend_unavailable, "down"));
  outcome o = run(*m, "GET", "/public", nullptr);
  EXPECT_EQ(o.action, outcome::action::pass);
  EXPECT_TRUE(o.headers.empty());
  EXPECT_EQ(m->counters()[3].backend_errors, 1u);
  EXPECT_EQ(m->counters()[3].admitted, 1u);

  auto opts = options();
  opts.on_error = failure_policy::deny;
  auto d = make(opts);
  fake->script.push_back(error(errc::key_too_long, "long"));
  o = run(*d, "GET", "/public", nullptr);
  EXPECT_EQ(o.action, outcome::action::refuse);
  EXPECT_EQ(o.status, 429);  // never a 500

  // A fail-open decision from a remote backend: admitted, no made-up figures.
  fake->script.push_back(decision{.allowed = true, .source = decision_source::fail_open});
  o = run(*m, "GET", "/public", nullptr);
  EXPECT_EQ(o.action, outcome::action::admit);
  EXPECT_TRUE(o.headers.empty());
}

TEST_F(middleware_test, ShadowModeNeverRefuses) {
  auto opts = options();
  opts.enforcement = enforcement::shadow;
  auto m = make(opts);
  fake->script.push_back(decision{.allowed = false, .limit = 60, .retry_after = 1s});
  outcome o = run(*m, "GET", "/public", nullptr);
  EXPECT_NE(o.action, outcome::action::refuse);
  EXPECT_TRUE(o.headers.empty());
  EXPECT_EQ(m->counters()[3].refused, 1u);
}

TEST_F(middleware_test, AsyncCheckCompletes) {
  auto m = make(options());
  const route_limit* r = m->find("GET", "/public");
  std::optional<outcome> got;
  m->check_async(m->prepare(*r, {.peer = "192.0.2.1"}, nullptr), [&](outcome o) { got = std::move(o); });
  ASSERT_TRUE(got);
  EXPECT_EQ(got->action, outcome::action::admit);
}

// --- regressions --------------------------------------------------------------------------------

// Errors that say the check cannot be made are not outages: on_error = allow must not admit them.
TEST_F(middleware_test, RequestErrorsAreRefusedWhateverOnErrorSays) {
  auto m = make(options());  // on_error = allow
  for (errc e : {errc::invalid_argument, errc::key_too_long, errc::cost_exceeds_burst, errc::unknown_rule}) {
    fake->script.push_back(error(e, "bad request"));
    outcome o = run(*m, "GET", "/public", nullptr);
    EXPECT_EQ(o.action, outcome::action::refuse) << static_cast<int>(e);
    EXPECT_EQ(o.status, 429);
    EXPECT_NE(o.body.find("\"code\": \"not_admissible\""), std::string::npos) << o.body;
    ASSERT_EQ(o.headers.size(), 1u);
    EXPECT_EQ(o.headers[0].name, "Retry-After");
    EXPECT_EQ(o.headers[0].value, "86400");  // the same request never passes: no retry storm
  }
  fake->script.push_back(error(errc::capacity_exhausted, "full"));
  outcome o = run(*m, "GET", "/public", nullptr);
  EXPECT_EQ(o.action, outcome::action::refuse);
  EXPECT_NE(o.body.find("\"code\": \"capacity_exhausted\""), std::string::npos) << o.body;
  EXPECT_EQ(o.headers.at(0).value, "1");

  // Only backend failures follow on_error.
  for (errc e : {errc::backend_unavailable, errc::backend_timeout, errc::backend_protocol, errc::backend_overloaded}) {
    fake->script.push_back(error(e, "down"));
    EXPECT_EQ(run(*m, "GET", "/public", nullptr).action, outcome::action::pass) << static_cast<int>(e);
  }
  auto c = m->counters()[3];
  EXPECT_EQ(c.invalid, 5u);
  EXPECT_EQ(c.refused, 5u);
  EXPECT_EQ(c.backend_errors, 4u);
  EXPECT_EQ(c.admitted, 4u);

  // Shadow mode still lets everything through, but counts it.
  auto opts = options();
  opts.enforcement = enforcement::shadow;
  auto s = make(opts);
  fake->script.push_back(error(errc::key_too_long, "long"));
  EXPECT_EQ(run(*s, "GET", "/public", nullptr).action, outcome::action::pass);
  EXPECT_EQ(s->counters()[3].invalid, 1u);
}

TEST_F(middleware_test, OverLongIdsAreKeyedOnTheirDigest) {
  auto m = make(options());
  auto key_of = [&](const identity& who, std::string_view target) {
    fake->asked.clear();
    (void)run(*m, "GET", target, &who);
    return fake->asked.at(0).key;
  };
  // "user:" + 507 bytes is exactly max_key_length: kept as it is.
  EXPECT_EQ(key_of({.user = std::string(507, 'a')}, "/notes"), "user:" + std::string(507, 'a'));
  // Longer: "user#" + the first 128 bits of SHA-256(id) (vectors from Python's hashlib; the
  // lengths cover one and two final SHA-256 blocks).
  EXPECT_EQ(key_of({.user = std::string(508, 'a')}, "/notes"), "user#f93f35cc413fbd7a7bc53ce4e81776e9");
  EXPECT_EQ(key_of({.user = std::string(600, 'a')}, "/notes"), "user#ba35c170729417f1499e0886e7e12fcd");
  EXPECT_EQ(key_of({.user = std::string(1000, 'b')}, "/notes"), "user#f6f118e120e52be0bd0cfdf2794cd12c");
  EXPECT_EQ(key_of({.user = std::string(567, 'x')}, "/notes"), "user#b2ef9f10093e1f6590e0f8df84092751");
  EXPECT_EQ(key_of({.user = std::string(568, 'x')}, "/notes"), "user#4c4e7b818fc26f34c4a2ef7f0e3df9c3");
  EXPECT_EQ(key_of({.user = std::string(576, 'x')}, "/notes"), "user#f88436cba79dda1b2a14526ccd64207b");
  EXPECT_EQ(key_of({.api_key = std::string(510, 'k')}, "/keys"), "key#778a8ca56e915e224a53bc981d235696");

  identity long_tenant{.user = "alice", .tenant = std::string(600, 't')};
  fake->asked.clear();
  (void)run(*m, "GET", "/tenant/x", &long_tenant);
  EXPECT_EQ(fake->asked.at(0).tenant, "tenant#7c40b9bfc399c6937670fad796d9a696");
  EXPECT_EQ(fake->asked.at(0).user, "user:alice");
}

// The reported bypass: limit 1, a 600-byte user id, 100 requests. Exactly one may go on.
TEST(MiddlewareMemory, LongIdentityCannotBypassTheLimit) {
  sluice::testing::simulated_clock clock;
  std::shared_ptr<backend> b = make_memory_backend({.clock = &clock}).value();
  auto m = middleware::create({.backend = b,
                               .rules = {{.name = "one", .limit = token_bucket_policy(per_second(0), 1)}},
                               .routes = {{.path = "/x", .rule = "one", .key = key_by::user}}});
  ASSERT_TRUE(m.ok());
  auto run = [&](const identity& who) {
    return (*m)->check((*m)->prepare(*(*m)->find("GET", "/x"), {.peer = "192.0.2.1"}, &who)).action;
  };
  identity longer{.user = std::string(600, 'u')};
  int admitted = 0;
  for (int i = 0; i < 100; ++i) admitted += run(longer) != outcome::action::refuse;
  EXPECT_EQ(admitted, 1);
  // Another long id (differing only past byte 512) has its own budget.
  identity other{.user = std::string(599, 'u') + "v"};
  EXPECT_EQ(run(other), outcome::action::admit);
  EXPECT_EQ((*m)->counters()[0].invalid, 0u);

  // A check the backend refuses as invalid (cost over the burst) is refused, not waved through.
  auto c = middleware::create({.backend = b,
                               .rules = {{.name = "small", .limit = token_bucket_policy(per_second(1), 2)}},
                               .routes = {{.path = "/x", .rule = "small", .key = key_by::user, .cost = 5}}});
  ASSERT_TRUE(c.ok());
  identity alice{.user = "alice"};
  outcome o = (*c)->check((*c)->prepare(*(*c)->find("GET", "/x"), {.peer = "192.0.2.1"}, &alice));
  EXPECT_EQ(o.action, outcome::action::refuse);
  EXPECT_EQ((*c)->counters()[0].invalid, 1u);
}

// Keeps each async_check's handler until the test fires it, as a Redis backend does while the
// reply is outstanding.
class deferred_backend : public backend {
 public:
  result<decision> decide(const check_request&) override {
    return decision{.allowed = true, .limit = 60, .remaining = 59};
  }
  void async_decide(const check_request& req, check_handler handler) override {
    keys.emplace_back(req.key);
    handlers.push_back(std::move(handler));
  }
  result<std::vector<decision>> decide_all(std::span<const check_request>) override {
    return error(errc::invalid_argument, "the middleware makes single checks");
  }
  void async_decide_all(std::span<const check_request> c, check_all_handler h) override { h(decide_all(c)); }
  bool ready() override { return true; }
  std::vector<std::string> keys;
  std::vector<check_handler> handlers;
};

TEST(MiddlewareLifetime, InFlightAsyncCheckKeepsTheMiddlewareAlive) {
  auto b = std::make_shared<deferred_backend>();
  auto m = middleware::create({.backend = b,
                               .rules = {{.name = "api", .limit = token_bucket_policy(per_second(5), 60)}},
                               .routes = {{.path = "/x", .rule = "api", .key = key_by::client_ip}}});
  ASSERT_TRUE(m.ok());
  std::shared_ptr<middleware> mw = *m;
  std::weak_ptr<middleware> watch = mw;
  std::optional<outcome> got;
  mw->check_async(mw->prepare(*mw->find("GET", "/x"), {.peer = "192.0.2.1"}, nullptr),
                  [&](outcome o) { got = std::move(o); });
  ASSERT_EQ(b->handlers.size(), 1u);

  // Its owners replace the middleware while the check is in flight (a reload, a new limiter).
  mw.reset();
  m = middleware::create({.backend = b});
  ASSERT_TRUE(m.ok());
  EXPECT_FALSE(watch.expired());

  // The reply arrives: it completes against the old middleware's rules (ASan would catch a freed one).
  b->handlers[0](decision{.allowed = true, .limit = 60, .remaining = 41});
  ASSERT_TRUE(got);
  EXPECT_EQ(got->action, outcome::action::admit);
  ASSERT_FALSE(got->headers.empty());
  EXPECT_EQ(got->headers[1].value, "41");
  EXPECT_EQ(b->keys[0], "ip:192.0.2.1");

  // Once the backend drops the handler, nothing holds the old middleware any more.
  b->handlers.clear();
  EXPECT_TRUE(watch.expired());
}

// Dual-layer routes keyed on something other than the user still use the caller's own tenant.
TEST_F(middleware_test, DualLayerIdentifiedCallersUseTheirTenant) {
  auto opts = options();
  opts.routes.push_back({.path = "/d/key", .rule = "dual", .key = key_by::api_key});
  opts.routes.push_back({.path = "/d/ip", .rule = "dual", .key = key_by::client_ip});
  opts.routes.push_back({.path = "/d/all", .rule = "dual", .key = key_by::global});
  opts.routes.push_back({.path = "/d/user", .rule = "dual", .key = key_by::user});
  auto m = make(opts);
  // The adapters ask for the identity on every dual-layer route.
  for (const char* path : {"/d/key", "/d/ip", "/d/all", "/d/user"})
    EXPECT_TRUE(m->needs_identity(*m->find("GET", path))) << path;
  EXPECT_FALSE(m->needs_identity(*m->find("GET", "/public")));

  identity keyed{.tenant = "acme", .api_key = "k1"};
  identity no_tenant{.user = "bob", .api_key = "k2"};
  identity tenant_only{.tenant = "acme"};
  struct expected_check {
    const char* path;
    const identity* who;
    const char* tenant;
    const char* user;
  };
  for (const auto& e : std::vector<expected_check>{
           {"/d/key", &keyed, "tenant:acme", "key:k1"},
           {"/d/ip", &keyed, "tenant:acme", "ip:192.0.2.1"},
           {"/d/all", &keyed, "tenant:acme", "global"},
           {"/d/key", nullptr, "anonymous", "ip:192.0.2.1"},
           {"/d/ip", nullptr, "anonymous", "ip:192.0.2.1"},
           {"/d/all", nullptr, "anonymous", "global"},
           {"/d/key", &no_tenant, "anonymous", "key:k2"},
           {"/d/user", &no_tenant, "anonymous", "user:bob"},
           {"/d/user", &tenant_only, "tenant:acme", "ip:192.0.2.1"},
       }) {
    fake->asked.clear();
    (void)run(*m, "GET", e.path, e.who);
    ASSERT_EQ(fake->asked.size(), 1u);
    EXPECT_EQ(fake->asked[0].tenant, e.tenant) << e.path;
    EXPECT_EQ(fake->asked[0].user, e.user) << e.path;
  }
}

// The reported case end to end: anonymous traffic exhausting the anonymous pseudo-tenant must not
// refuse API-key callers of a real tenant.
TEST(MiddlewareMemory, AnonymousFloodDoesNotRefuseIdentifiedTenants) {
  sluice::testing::simulated_clock clock;
  auto m = middleware::create({.backend = make_memory_backend({.clock = &clock}).value(),
                               .rules = {{.name = "dual",
                                          .limit = token_bucket_policy(per_second(0), 100),
                                          .tenant = token_bucket_policy(per_second(0), 10)}},
                               .routes = {{.path = "/api", .rule = "dual", .key = key_by::api_key}}});
  ASSERT_TRUE(m.ok());
  auto run = [&](const identity* who, std::string_view peer) {
    return (*m)->check((*m)->prepare(*(*m)->find("GET", "/api"), {.peer = peer}, who)).action;
  };
  int anonymous_admitted = 0;
  for (int i = 0; i < 50; ++i)
    anonymous_admitted += run(nullptr, "198.51.100." + std::to_string(i + 1)) != outcome::action::refuse;
  EXPECT_EQ(anonymous_admitted, 10);  // the anonymous tenant's budget
  identity acme{.tenant = "acme", .api_key = "k1"};
  EXPECT_EQ(run(&acme, "192.0.2.1"), outcome::action::admit);
}

// The refusal message follows decision::binding, the same layer the header figures report.
TEST_F(middleware_test, RefusalWordingFollowsTheBindingLayer) {
  auto opts = options();
  opts.rules.push_back(
      {.name = "dq", .limit = token_bucket_policy(per_second(5), 60), .tenant = fixed_window_policy(1000, 24h)});
  opts.routes.insert(opts.routes.begin(), {.path = "/dq", .rule = "dq"});
  opts.headers.ietf_fields = true;
  auto m = make(opts);
  identity alice{.user = "alice", .tenant = "acme"};

  fake->script.push_back(decision{.allowed = false,
                                  .limit = 1000,
                                  .retry_after = 3600s,
                                  .reset_after = 3600s,
                                  .dual_layer = true,
                                  .rejected_by = layer::tenant,
                                  .binding = layer::tenant});
  outcome o = run(*m, "GET", "/dq", &alice);
  EXPECT_NE(o.body.find("\"code\": \"quota_exceeded\""), std::string::npos) << o.body;
  EXPECT_NE(o.body.find("tenant quota exhausted"), std::string::npos) << o.body;
  bool tenant_window = false;  // w = the tenant window, from the same binding layer
  for (const auto& h : o.headers) tenant_window |= h.name == "RateLimit-Policy" && h.value == "\"dq\";q=1000;w=86400";
  EXPECT_TRUE(tenant_window);

  fake->script.push_back(decision{.allowed = false,
                                  .limit = 60,
                                  .retry_after = 1s,
                                  .reset_after = 12s,
                                  .dual_layer = true,
                                  .rejected_by = layer::user,
                                  .binding = layer::user});
  o = run(*m, "GET", "/dq", &alice);
  EXPECT_NE(o.body.find("\"code\": \"too_many_requests\""), std::string::npos) << o.body;
  EXPECT_EQ(o.body.find("tenant"), std::string::npos) << o.body;
  // The wording reads `binding` alone (a backend that reports the tenant layer as binding without
  // naming a refusing layer still gets the tenant's wording, matching its header figures).
  fake->script.push_back(decision{.allowed = false,
                                  .limit = 1000,
                                  .retry_after = 3600s,
                                  .reset_after = 3600s,
                                  .dual_layer = true,
                                  .binding = layer::tenant});
  o = run(*m, "GET", "/dq", &alice);
  EXPECT_NE(o.body.find("tenant quota exhausted"), std::string::npos) << o.body;
}

TEST(RefusalBody, EscapesJson) {
  EXPECT_EQ(refusal_body("c", "a\"b\\c\n\x01", 1),
            "{\"error\": {\"code\": \"c\", \"message\": \"a\\\"b\\\\c\\n\\u0001\"}, \"retry_after_ms\": 1}");
}

}  // namespace
