// SPDX-License-Identifier: Apache-2.0
// The cpp-httplib middleware, tested against the real notes_httplib example over real HTTP.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "http_fixture.hpp"

namespace {

using namespace sluice::testing;
using json = nlohmann::json;

struct httplib_server {
  explicit httplib_server(std::vector<std::string> extra = {}) : proc(args(std::move(extra))), port(proc.port()) {}
  static std::vector<std::string> args(std::vector<std::string> extra) {
    std::vector<std::string> a{NOTES_HTTPLIB, "--listen", "127.0.0.1:0"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  child proc;
  int port;
};

http_request as_user(const std::string& user, const std::string& target) {
  return {.target = target, .headers = {{"X-User", user}}};
}

std::string code_of(const http_response& r) {
  json j = json::parse(r.body, nullptr, false);
  return j.is_object() && j.contains("error") && j["error"].is_object() ? j["error"].value("code", "") : "";
}

TEST(NotesHttplib, PerUserIsolationAndRefusal) {
  httplib_server s;
  auto a = exhaust(s.port, [](int) { return as_user("alice", "/notes"); });
  EXPECT_GE(a.admitted, 60);
  ASSERT_EQ(a.refusal.status, 429);
  EXPECT_EQ(code_of(a.refusal), "too_many_requests");
  EXPECT_EQ(a.refusal.header("x-ratelimit-limit"), "60");
  EXPECT_EQ(a.refusal.header("x-ratelimit-remaining"), "0");
  EXPECT_GE(std::stoi(a.refusal.header("retry-after")), 1);
  const int retry_ms = json::parse(a.refusal.body)["retry_after_ms"].get<int>();
  EXPECT_EQ((retry_ms + 999) / 1000, std::stoi(a.refusal.header("retry-after")));

  auto b = http(s.port, as_user("bob", "/notes"));
  EXPECT_EQ(b.status, 200);
  EXPECT_EQ(b.header("x-ratelimit-remaining"), "59");
}

TEST(NotesHttplib, QuotaCode) {
  httplib_server s;
  auto q = exhaust(
      s.port, [](int) { return as_user("alice", "/export"); }, 30);
  EXPECT_EQ(q.admitted, 10);
  ASSERT_EQ(q.refusal.status, 429);
  EXPECT_EQ(code_of(q.refusal), "quota_exceeded");
}

TEST(NotesHttplib, PerIpAndSpoofedForwardedForIgnored) {
  httplib_server s;
  auto r = exhaust(s.port, [](int i) {
    return http_request{.target = "/public",
                        .headers = {{"X-Forwarded-For", "198.51.100." + std::to_string(i % 250 + 1)}}};
  });
  EXPECT_GE(r.admitted, 60);
  EXPECT_LT(r.admitted, 120);
  ASSERT_EQ(r.refusal.status, 429);
  EXPECT_EQ(http_get(s.port, "/public", {}, "127.0.0.2").status, 200);
}

// httplib answers HEAD with the GET handler: a GET route must check and count it.
TEST(NotesHttplib, HeadIsLimitedAsTheGetItRuns) {
  httplib_server s;
  auto q = exhaust(
      s.port,
      [](int) {
        return http_request{.method = "HEAD", .target = "/export", .headers = {{"X-User", "alice"}}};
      },
      30);
  EXPECT_EQ(q.admitted, 10);
  ASSERT_EQ(q.refusal.status, 429);
  EXPECT_EQ(http(s.port, as_user("alice", "/export")).status, 429) << "the HEADs spent alice's quota";
  EXPECT_EQ(http(s.port, as_user("bob", "/export")).status, 200);
}

// A client at its limit behind the proxy cannot get a fresh budget with a header the middleware
// cannot parse: the proxy appended the real address, and only that part is read.
TEST(NotesHttplib, MalformedClientPrefixDoesNotEscapeTheLimit) {
  httplib_server s({"--trusted-proxy", "127.0.0.1"});
  auto r = exhaust(s.port, [](int) {
    return http_request{.target = "/public", .headers = {{"X-Forwarded-For", "198.51.100.7"}}};
  });
  ASSERT_EQ(r.refusal.status, 429);
  for (const std::string& prefix : {std::string("\"x"), std::string(4000, ' ') + "x", std::string("a, b, c, [")}) {
    EXPECT_EQ(http_get(s.port, "/public", {{"X-Forwarded-For", prefix + ", 198.51.100.7"}}).status, 429);
  }
}

TEST(NotesHttplib, TrustedProxyHonoured) {
  httplib_server s({"--trusted-proxy", "127.0.0.1"});
  auto r = exhaust(s.port, [](int) {
    return http_request{.target = "/public", .headers = {{"X-Forwarded-For", "198.51.100.7"}}};
  });
  ASSERT_EQ(r.refusal.status, 429);
  EXPECT_EQ(http_get(s.port, "/public", {{"X-Forwarded-For", "198.51.100.8"}}).status, 200);
}

// X-User is client-supplied here: a user id longer than a key may be must be limited like any
// other (keyed on its digest), not waved through as a backend error.
TEST(NotesHttplib, LongUserIdIsLimitedNotWavedThrough) {
  httplib_server s;
  const std::string long_user(600, 'u');
  auto a = exhaust(s.port, [&](int) { return as_user(long_user, "/notes"); });
  EXPECT_GE(a.admitted, 60);
  EXPECT_LT(a.admitted, 120);
  ASSERT_EQ(a.refusal.status, 429);
  EXPECT_EQ(code_of(a.refusal), "too_many_requests");
  EXPECT_EQ(a.refusal.header("x-ratelimit-remaining"), "0");

  // Another long id, equal to the first over its first 599 bytes, has a budget of its own.
  auto b = http(s.port, as_user(std::string(599, 'u') + "v", "/notes"));
  EXPECT_EQ(b.status, 200);
  EXPECT_EQ(b.header("x-ratelimit-remaining"), "59");

  auto stats = json::parse(http_get(s.port, "/stats").body, nullptr, false);
  ASSERT_TRUE(stats.is_object());
  for (const auto& rule : stats["rules"]) {
    EXPECT_EQ(rule["backend_errors"].get<int>(), 0) << rule;
    EXPECT_EQ(rule["invalid"].get<int>(), 0) << rule;
  }
}

TEST(NotesHttplib, ExemptAndAdmittedHeaders) {
  httplib_server s;
  for (int i = 0; i < 80; ++i) {
    auto h = http_get(s.port, "/healthz");
    ASSERT_EQ(h.status, 200);
    EXPECT_FALSE(h.has("x-ratelimit-limit"));
  }
  auto p = http_get(s.port, "/public");
  EXPECT_EQ(p.status, 200);
  EXPECT_EQ(p.header("x-ratelimit-limit"), "60");
  EXPECT_EQ(p.header("x-ratelimit-remaining"), "59");
}

}  // namespace
