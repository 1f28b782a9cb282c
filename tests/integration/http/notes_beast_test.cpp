// SPDX-License-Identifier: Apache-2.0
// The Beast middleware, tested against the real notes_beast example over real HTTP.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "http_fixture.hpp"

namespace {

using namespace sluice::testing;
using json = nlohmann::json;

// Starts notes_beast on a free port of 127.0.0.1 with `extra` arguments.
struct notes_server {
  explicit notes_server(std::vector<std::string> extra = {}) : proc(args(std::move(extra))), port(proc.port()) {}

  static std::vector<std::string> args(std::vector<std::string> extra) {
    std::vector<std::string> a{NOTES_BEAST, "--listen", "127.0.0.1:0"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }

  std::string login(const std::string& tenant, const std::string& user) {
    auto r =
        http(port, {.method = "POST", .target = "/login", .body = json{{"tenant", tenant}, {"user", user}}.dump()});
    EXPECT_EQ(r.status, 200) << r.body;
    json j = json::parse(r.body, nullptr, false);
    if (!j.is_object() || !j.contains("token")) return {};
    return "Bearer " + j["token"].get<std::string>();
  }

  http_request as(const std::string& token, const std::string& target, const std::string& method = "GET") const {
    return {.method = method, .target = target, .headers = {{"Authorization", token}}};
  }

  child proc;
  int port;
};

long long number(const http_response& r, const std::string& name) {
  std::string v = r.header(name);
  EXPECT_FALSE(v.empty()) << "missing " << name;
  return v.empty() ? -1 : std::stoll(v);
}

// Every refusal: 429, JSON body with the code (sluiced's error shape), retry_after_ms that rounds up
// to Retry-After >= 1, X-RateLimit-*.
void expect_refusal(const http_response& r, const std::string& code, long long limit) {
  ASSERT_EQ(r.status, 429);
  EXPECT_EQ(r.header("content-type"), "application/json");
  json body = json::parse(r.body, nullptr, false);
  ASSERT_TRUE(body.is_object()) << r.body;
  ASSERT_TRUE(body.contains("error") && body["error"].is_object()) << r.body;
  EXPECT_EQ(body["error"].value("code", ""), code);
  EXPECT_FALSE(body["error"].value("message", "").empty());
  long long retry = number(r, "retry-after");
  EXPECT_GE(retry, 1);
  const long long retry_ms = body.value("retry_after_ms", -1LL);
  EXPECT_GE(retry_ms, 1);
  EXPECT_EQ((retry_ms + 999) / 1000, retry) << "Retry-After is retry_after_ms in whole seconds, rounded up";
  EXPECT_EQ(number(r, "x-ratelimit-limit"), limit);
  EXPECT_EQ(number(r, "x-ratelimit-remaining"), 0);
  auto now =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_GE(number(r, "x-ratelimit-reset"), now);
}

TEST(NotesBeast, AdmittedResponsesCarryTheHeaders) {
  notes_server s;
  auto alice = s.login("acme", "alice");
  auto first = http(s.port, s.as(alice, "/notes"));
  ASSERT_EQ(first.status, 200);
  EXPECT_EQ(number(first, "x-ratelimit-limit"), 60);
  EXPECT_EQ(number(first, "x-ratelimit-remaining"), 59);
  EXPECT_FALSE(first.has("retry-after"));
  auto second = http(s.port, s.as(alice, "/notes", "POST"));
  ASSERT_EQ(second.status, 201);
  EXPECT_LE(number(second, "x-ratelimit-remaining"), 59);  // GET and POST /notes share the user's bucket
}

TEST(NotesBeast, PerUserIsolation) {
  notes_server s;
  auto alice = s.login("acme", "alice");
  auto bob = s.login("acme", "bob");
  auto a = exhaust(s.port, [&](int) { return s.as(alice, "/notes"); });
  EXPECT_GE(a.admitted, 60);  // burst 60 (plus whatever refilled at 5/s meanwhile)
  EXPECT_EQ(a.other, 0);
  expect_refusal(a.refusal, "too_many_requests", 60);

  auto b = http(s.port, s.as(bob, "/notes"));
  EXPECT_EQ(b.status, 200);
  EXPECT_EQ(number(b, "x-ratelimit-remaining"), 59);
}

TEST(NotesBeast, QuotaAndRateLimitAnswerDifferentCodes) {
  notes_server s;
  auto alice = s.login("acme", "alice");
  auto quota = exhaust(
      s.port, [&](int) { return s.as(alice, "/export"); }, 30);
  EXPECT_EQ(quota.admitted, 10);
  expect_refusal(quota.refusal, "quota_exceeded", 10);

  auto rate = exhaust(s.port, [&](int) { return s.as(alice, "/notes"); });
  expect_refusal(rate.refusal, "too_many_requests", 60);
}

TEST(NotesBeast, AnonymousLimitedPerClientIp) {
  notes_server s;
  auto first = exhaust(s.port, [](int) { return http_request{.target = "/public"}; });
  EXPECT_GE(first.admitted, 60);
  expect_refusal(first.refusal, "too_many_requests", 60);

  // Another client address (the loopback net is ours): its own budget.
  auto other = http_get(s.port, "/public", {}, "127.0.0.2");
  EXPECT_EQ(other.status, 200);
  EXPECT_EQ(number(other, "x-ratelimit-remaining"), 59);
}

TEST(NotesBeast, UnauthenticatedRequestsAreLimitedPerIpThenRejectedByTheService) {
  notes_server s;
  auto r = http_get(s.port, "/notes");
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(number(r, "x-ratelimit-remaining"), 59);
  auto forged = http_get(s.port, "/notes", {{"Authorization", "Bearer not-a-token"}});
  EXPECT_EQ(forged.status, 401);
  EXPECT_LE(number(forged, "x-ratelimit-remaining"), 58);  // same anonymous per-IP key
}

TEST(NotesBeast, SpoofedForwardingHeadersFromUntrustedPeerAreIgnored) {
  notes_server s;  // no --trusted-proxy: 127.0.0.1 is a client like any other
  auto r = exhaust(s.port, [](int i) {
    std::string fake = "198.51.100." + std::to_string(i % 250 + 1);
    return http_request{.target = "/public", .headers = {{"X-Forwarded-For", fake}, {"Forwarded", "for=" + fake}}};
  });
  EXPECT_GE(r.admitted, 60);
  EXPECT_LT(r.admitted, 120);  // one bucket for all of them, whatever they claim
  expect_refusal(r.refusal, "too_many_requests", 60);
}

TEST(NotesBeast, TrustedProxyHeadersAreHonoured) {
  notes_server s({"--trusted-proxy", "127.0.0.0/8"});
  auto client = [](const std::string& xff) {
    return http_request{.target = "/public", .headers = {{"X-Forwarded-For", xff}}};
  };

  auto seven = exhaust(s.port, [&](int) { return client("198.51.100.7"); });
  EXPECT_GE(seven.admitted, 60);
  expect_refusal(seven.refusal, "too_many_requests", 60);

  // Another client behind the proxy has its own budget; so does the proxy itself.
  EXPECT_EQ(http(s.port, client("198.51.100.8")).status, 200);
  EXPECT_EQ(http_get(s.port, "/public").status, 200);

  // Right to left: trusted hops are skipped, and a value the client prepended changes nothing.
  EXPECT_EQ(http(s.port, client("198.51.100.7, 127.0.0.5")).status, 429);
  EXPECT_EQ(http(s.port, client("203.0.113.99, 198.51.100.7")).status, 429);
  // Several header lines are one list.
  EXPECT_EQ(http(s.port, {.target = "/public",
                          .headers = {{"X-Forwarded-For", "203.0.113.99"}, {"X-Forwarded-For", "198.51.100.7"}}})
                .status,
            429);

  // The client's own Forwarded header is ignored: the proxy writes X-Forwarded-For.
  EXPECT_EQ(
      http(s.port, {.target = "/public",
                    .headers = {{"Forwarded", "for=\"[2001:db8::1]:4711\""}, {"X-Forwarded-For", "198.51.100.7"}}})
          .status,
      429);
}

TEST(NotesBeast, TrustedProxyWritingForwardedIsHonoured) {
  notes_server s({"--trusted-proxy", "127.0.0.1/32", "--client-ip-header", "forwarded"});
  auto r = exhaust(s.port, [](int) {
    return http_request{.target = "/public", .headers = {{"Forwarded", "for=198.51.100.7;proto=http"}}};
  });
  EXPECT_GE(r.admitted, 60);
  expect_refusal(r.refusal, "too_many_requests", 60);
  EXPECT_EQ(http(s.port, {.target = "/public", .headers = {{"Forwarded", "for=\"[2001:db8::1]:4711\""}}}).status, 200);
  // Here X-Forwarded-For is the header a client could forge: ignored (the key is 198.51.100.7's).
  EXPECT_EQ(http(s.port, {.target = "/public",
                          .headers = {{"Forwarded", "for=198.51.100.7"}, {"X-Forwarded-For", "203.0.113.1"}}})
                .status,
            429);
}

class HostileForwarding : public ::testing::TestWithParam<const char*> {};

// Headers from which no client can be found share one budget (ip:unresolved), never the proxy's.
TEST_P(HostileForwarding, UnresolvableHeadersShareOneKeyNotTheProxys) {
  const std::string header = GetParam() == std::string("forwarded") ? "Forwarded" : "X-Forwarded-For";
  notes_server s({"--trusted-proxy", "127.0.0.1/32", "--client-ip-header", GetParam()});
  // The proxy's own budget (requests it sends itself, with no forwarding header) is spent first.
  auto own = exhaust(s.port, [](int) { return http_request{.target = "/public"}; });
  ASSERT_EQ(own.refusal.status, 429);

  const std::vector<std::string> hostile = {
      "garbage",
      ",,,,",
      "[",
      "[::1",
      "1.2.3.4:99999999",
      "999.1.1.1",
      "for=",
      "\"unterminated",
      std::string(9000, '1'),
      std::string(3000, ','),
      "1.1.1.1," + std::string(200, ' ') + "x",
      "1.1.1.1;for=2.2.2.2",
      "unknown",
      "_hidden",
      "::ffff:1.2.3.4%eth0",
  };
  int admitted = 0;
  for (int round = 0; round < 6; ++round) {
    for (const auto& h : hostile) {
      auto r = http(s.port, {.target = "/public", .headers = {{header, h}}});
      ASSERT_TRUE(r.status == 200 || r.status == 429) << "header '" << h << "' gave " << r.status;
      if (r.status == 200) ++admitted;
    }
  }
  // 90 requests on one shared budget of 60 (plus what refills meanwhile), none on the proxy's.
  EXPECT_GE(admitted, 60);
  EXPECT_LT(admitted, 80);
  EXPECT_EQ(http_get(s.port, "/healthz").status, 200);
}

// The client at its limit writes its own header; the proxy appends the real address. Whatever the
// client wrote to the left is never parsed, so the client stays on its own exhausted budget.
TEST_P(HostileForwarding, ClientWrittenPrefixCannotEscapeTheLimit) {
  const bool forwarded = GetParam() == std::string("forwarded");
  const std::string header = forwarded ? "Forwarded" : "X-Forwarded-For";
  const std::string hop = forwarded ? "for=198.51.100.7" : "198.51.100.7";
  notes_server s({"--trusted-proxy", "127.0.0.1/32", "--client-ip-header", GetParam()});
  auto client = exhaust(s.port, [&](int) { return http_request{.target = "/public", .headers = {{header, hop}}}; });
  ASSERT_EQ(client.refusal.status, 429);

  std::string junk_hops;
  for (int i = 0; i < 64; ++i) junk_hops += "junk" + std::to_string(i) + ", ";
  const std::vector<std::string> prefixes = {
      forwarded ? "for=\"x" : "\"x",   // an unterminated quote
      junk_hops,                       // 64 junk hops
      std::string(9000, ' ') + "pad",  // more than 8 KiB of padding
      "[",
      "for=\"[::1",
      "203.0.113.9",
  };
  for (const auto& p : prefixes) {
    auto r = http(s.port, {.target = "/public", .headers = {{header, p + ", " + hop}}});
    EXPECT_EQ(r.status, 429) << "prefix '" << p.substr(0, 40) << "' escaped the limit";
  }
  // The same prefixes from a client with budget left are admitted on that client's key.
  auto fresh =
      http(s.port, {.target = "/public",
                    .headers = {{header, prefixes[0] + ", " + (forwarded ? "for=198.51.100.8" : "198.51.100.8")}}});
  EXPECT_EQ(fresh.status, 200);
}

INSTANTIATE_TEST_SUITE_P(NotesBeast, HostileForwarding, ::testing::Values("x-forwarded-for", "forwarded"));

// A chunked request whose trailer field exceeds Beast's field size made it throw out of io_context::run.
TEST(NotesBeast, OversizedTrailerDoesNotEndTheProcess) {
  notes_server s;
  for (int i = 0; i < 3; ++i) {
    auto r = http(s.port, {.target = "/healthz",
                           .headers = {{"Transfer-Encoding", "chunked"}},
                           .body = "0\r\nX: " + std::string(65536, 'a') + "\r\n\r\n"});
    EXPECT_NE(r.status, 200);
  }
  EXPECT_EQ(http_get(s.port, "/healthz").status, 200);
  EXPECT_EQ(http_get(s.port, "/public").status, 200);
}

TEST(NotesBeast, DualLayerTenantExhaustion) {
  notes_server s;
  auto alice = s.login("acme", "alice");
  auto bob = s.login("acme", "bob");
  auto carol = s.login("globex", "carol");

  // alice spends her own budget (60) and with it 60 of acme's 100.
  auto a = exhaust(s.port, [&](int) { return s.as(alice, "/tenant/notes"); });
  EXPECT_GE(a.admitted, 60);
  expect_refusal(a.refusal, "too_many_requests", 60);
  EXPECT_EQ(json::parse(a.refusal.body)["error"].value("message", "").find("tenant"), std::string::npos);

  // bob has a full personal budget, but acme has only ~40 left (refilling at 1/s).
  auto b = exhaust(s.port, [&](int) { return s.as(bob, "/tenant/notes"); });
  EXPECT_GE(b.admitted, 30);
  EXPECT_LT(b.admitted, 60);
  ASSERT_EQ(b.refusal.status, 429);
  EXPECT_NE(json::parse(b.refusal.body)["error"].value("message", "").find("tenant"), std::string::npos)
      << b.refusal.body;

  // Another tenant is not affected.
  auto c = http(s.port, s.as(carol, "/tenant/notes"));
  EXPECT_EQ(c.status, 200);
}

TEST(NotesBeast, ExemptRoutesAreNeverLimited) {
  notes_server s;
  for (int i = 0; i < 100; ++i) {
    auto r = http_get(s.port, "/healthz");
    ASSERT_EQ(r.status, 200);
    EXPECT_FALSE(r.has("x-ratelimit-limit"));
  }
  auto stats = json::parse(http_get(s.port, "/stats").body, nullptr, false);
  ASSERT_TRUE(stats.is_object());
  for (const auto& rule : stats["rules"]) EXPECT_EQ(rule["allowed"].get<int>() + rule["rejected"].get<int>(), 0);
}

TEST(NotesBeast, CountersPerRule) {
  notes_server s;
  auto r = exhaust(s.port, [](int) { return http_request{.target = "/public"}; });
  ASSERT_EQ(r.refusal.status, 429);
  auto stats = json::parse(http_get(s.port, "/stats").body, nullptr, false);
  bool found = false;
  for (const auto& rule : stats["rules"]) {
    if (rule["rule"] != "public") continue;
    found = true;
    EXPECT_EQ(rule["allowed"].get<int>(), r.admitted);
    EXPECT_EQ(rule["rejected"].get<int>(), 1);
    EXPECT_EQ(rule["backend_errors"].get<int>(), 0);
  }
  EXPECT_TRUE(found);
}

#ifdef NOTES_BEAST_HAS_METRICS
// The same counters for a Prometheus scrape, in sluiced's exposition format.
TEST(NotesBeast, MetricsRouteExportsTheCounters) {
  notes_server s;
  auto r = exhaust(s.port, [](int) { return http_request{.target = "/public"}; });
  ASSERT_EQ(r.refusal.status, 429);
  auto m = http_get(s.port, "/metrics");
  ASSERT_EQ(m.status, 200);
  EXPECT_NE(m.body.find("# TYPE sluice_middleware_requests_total counter"), std::string::npos);
  EXPECT_NE(m.body.find("sluice_middleware_requests_total{rule=\"public\",result=\"allowed\"} " +
                        std::to_string(r.admitted) + "\n"),
            std::string::npos)
      << m.body;
  EXPECT_NE(m.body.find("sluice_middleware_requests_total{rule=\"public\",result=\"rejected\"} 1\n"), std::string::npos);
  EXPECT_FALSE(m.has("x-ratelimit-limit"));  // exempt
}
#endif

TEST(NotesBeast, ShadowModeCountsButNeverRefuses) {
  notes_server s({"--shadow"});
  for (int i = 0; i < 80; ++i) {
    auto r = http_get(s.port, "/public");
    ASSERT_EQ(r.status, 200);
    EXPECT_FALSE(r.has("x-ratelimit-limit"));
  }
  auto stats = json::parse(http_get(s.port, "/stats").body, nullptr, false);
  for (const auto& rule : stats["rules"]) {
    if (rule["rule"] == "public") {
      EXPECT_GE(rule["rejected"].get<int>(), 1);
    }
  }
}

TEST(NotesBeast, NoLimitSwitchesTheMiddlewareOff) {
  notes_server s({"--no-limit"});
  for (int i = 0; i < 80; ++i) {
    auto r = http_get(s.port, "/public");
    ASSERT_EQ(r.status, 200);
    EXPECT_FALSE(r.has("x-ratelimit-limit"));
  }
}

#ifdef SLUICE_TEST_WITH_REDIS
TEST(NotesBeast, RedisDownRequestsStillServed) {
  int redis_port = free_port();
  child redis({REDIS_SERVER, "--port", std::to_string(redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
               "no", "--dir", "/tmp"},
              child::output::discard);
  notes_server s({"--redis", "127.0.0.1:" + std::to_string(redis_port)});

  // Until the backend has connected, checks fail open without headers; wait (bounded) for Redis.
  http_response r;
  for (int i = 0; i < 200 && !r.has("x-ratelimit-limit"); ++i) {
    r = http_get(s.port, "/public");
    ASSERT_EQ(r.status, 200);
    if (!r.has("x-ratelimit-limit")) std::this_thread::sleep_for(std::chrono::milliseconds(25));  // Redis starting
  }
  ASSERT_TRUE(r.has("x-ratelimit-limit")) << "Redis never decided";
  EXPECT_EQ(number(r, "x-ratelimit-limit"), 60);

  redis.stop(SIGKILL);
  auto alice = s.login("acme", "alice");
  for (int i = 0; i < 100; ++i) {  // more than any budget: nothing is refused, nothing fails
    auto p = http_get(s.port, "/public");
    ASSERT_EQ(p.status, 200) << "request " << i;
    ASSERT_EQ(http(s.port, s.as(alice, "/notes")).status, 200) << "request " << i;
  }
}
#endif

}  // namespace
