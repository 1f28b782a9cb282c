// SPDX-License-Identifier: Apache-2.0
#include "server/api.hpp"
#include "sluice/http/headers.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "sluice/memory_backend.hpp"
#include "sluice/rule_set.hpp"

namespace sluice::server {
namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;

config test_config() {
  auto c = parse_config(R"(
[ratelimit]
algorithm = "token_bucket"
token_rate = 1
token_burst = 5
[[rules]]
name = "ai"
algorithm = "sliding_window"
limit = 3
window = 60
[[rules]]
name = "t"
algorithm = "sliding_window"
window = 60
tenant_limit = 10
user_limit = 2
)",
                        "t.toml");
  EXPECT_TRUE(c.ok());
  return std::move(*c);
}

// The test config's rules prepared on a memory backend, as sluiced holds them.
struct test_rules {
  config cfg = test_config();
  std::unique_ptr<memory_backend> backend = make_memory_backend({}).value();
  std::shared_ptr<const rule_set> set = rule_set::build(*backend, cfg.rules, {}, nullptr).value();
  const rule_set& operator*() const { return *set; }
  const rule& named(std::string_view name) const { return set->find(name)->definition(); }
};

api_error error_of(std::string_view body, const test_rules& c) {
  auto r = parse_check_body(body, *c);
  EXPECT_TRUE(std::holds_alternative<api_error>(r)) << body;
  return std::holds_alternative<api_error>(r) ? std::get<api_error>(r) : api_error{};
}

TEST(CheckBody, SingleDefaults) {
  test_rules c;
  auto r = parse_check_body(R"({"key":"user:42"})", *c);
  ASSERT_TRUE(std::holds_alternative<check_batch>(r));
  const auto& b = std::get<check_batch>(r);
  EXPECT_FALSE(b.batch);
  ASSERT_EQ(b.items.size(), 1u);
  EXPECT_EQ(b.items[0].rule, &c.named("default"));
  EXPECT_EQ(b.items[0].key, "user:42");
  EXPECT_EQ(b.items[0].cost, 1);
  check_request req = b.items[0].request();
  EXPECT_EQ(req.key, "user:42");
  EXPECT_EQ(req.rule, c.set->find("default"));
}

TEST(CheckBody, DualLayer) {
  test_rules c;
  auto r = parse_check_body(R"({"rule":"t","tenant":"acme","user":"bob","cost":2})", *c);
  ASSERT_TRUE(std::holds_alternative<check_batch>(r));
  const auto& item = std::get<check_batch>(r).items[0];
  EXPECT_EQ(item.tenant, "acme");
  EXPECT_EQ(item.user, "bob");
  EXPECT_EQ(item.cost, 2);
}

TEST(CheckBody, Errors) {
  test_rules c;
  for (const char* body :
       {"", "{", "[]", "1", "null", R"({"key":1})", R"({"key":"k","cost":"1"})", R"({"key":"k","cost":1.0})",
        R"({"key":"k","cost":18446744073709551615})", R"({})", R"({"key":"k","x":1})", R"({"rule":"t","key":"k"})",
        R"({"rule":"t","tenant":"a"})", R"({"key":"k","tenant":"a"})", R"({"checks":[]})", R"({"checks":{}})",
        R"({"checks":[{"key":"a"}],"key":"b"})"}) {
    api_error e = error_of(body, c);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.code, "invalid_request") << body;
  }
  api_error unknown = error_of(R"({"rule":"nope","key":"k"})", c);
  EXPECT_EQ(unknown.status, 404);
  EXPECT_EQ(unknown.code, "unknown_rule");
  api_error big = error_of(std::string(max_body_bytes + 1, ' '), c);
  EXPECT_EQ(big.status, 413);
}

// Parsing reads shapes; a value out of range is the backend's to refuse, as for every check: a 400
// through api_error_of, and nothing recorded.
TEST(CheckBody, ValuesAreRefusedByTheCheck) {
  test_rules c;
  for (const std::string& body :
       std::vector<std::string>{R"({"key":"k","cost":-1})", R"({"key":"k","cost":6})",
                                R"({"key":""})", R"({"key":")" + std::string(513, 'k') + R"("})"}) {
    auto r = parse_check_body(body, *c);
    ASSERT_TRUE(std::holds_alternative<check_batch>(r)) << body;
    auto d = c.backend->check(std::get<check_batch>(r).items[0].request());
    ASSERT_FALSE(d.ok()) << body;
    EXPECT_EQ(d.error().code, condition::invalid_request) << body;
    EXPECT_EQ(api_error_of(d.error()).status, 400) << body;
    EXPECT_EQ(api_error_of(d.error()).code, "invalid_request") << body;
  }
  EXPECT_EQ(c.backend->key_count(), 0u);
}

TEST(CheckBody, BatchItemsCarryTheirOwnErrors) {
  test_rules c;
  auto r = parse_check_body(R"({"checks":[{"key":"a"},{"rule":"nope","key":"b"},{"cost":"0","key":"c"},7]})", *c);
  ASSERT_TRUE(std::holds_alternative<check_batch>(r));
  const auto& b = std::get<check_batch>(r);
  EXPECT_TRUE(b.batch);
  ASSERT_EQ(b.items.size(), 4u);
  EXPECT_FALSE(b.items[0].error);
  EXPECT_EQ(b.items[1].error->code, "unknown_rule");
  EXPECT_EQ(b.items[2].error->code, "invalid_request");
  EXPECT_EQ(b.items[3].error->code, "invalid_request");
  std::string many = R"({"checks":[)";
  for (std::size_t i = 0; i <= max_batch_checks; ++i) many += std::string(i ? "," : "") + R"({"key":"k"})";
  many += "]}";
  EXPECT_EQ(error_of(many, c).code, "invalid_request");
}

// A reset names a key, or a tenant and maybe a user; it takes no cost, and anything else is refused.
TEST(ResetBody, NamesOneKeyOrLayer) {
  test_rules c;
  auto item = [&](std::string_view body) {
    auto r = parse_reset_body(body, *c);
    EXPECT_TRUE(std::holds_alternative<check_item>(r)) << body;
    return std::holds_alternative<check_item>(r) ? std::get<check_item>(r) : check_item{};
  };
  EXPECT_EQ(item(R"({"key":"user:42"})").key, "user:42");
  EXPECT_EQ(item(R"({"key":"user:42"})").rule, &c.named("default"));
  EXPECT_EQ(item(R"({"rule":"t","tenant":"acme"})").user, "");
  EXPECT_EQ(item(R"({"rule":"t","tenant":"acme","user":"bob"})").user, "bob");
  for (std::string_view bad : {R"({"key":"k","cost":1})", R"({})", R"({"rule":"t","user":"bob"})",
                               R"({"rule":"t","key":"k"})", R"({"key":7})", R"([])", R"(nope)"}) {
    auto r = parse_reset_body(bad, *c);
    ASSERT_TRUE(std::holds_alternative<api_error>(r)) << bad;
    EXPECT_EQ(std::get<api_error>(r).status, 400) << bad;
  }
  EXPECT_EQ(std::get<api_error>(parse_reset_body(R"({"rule":"nope","key":"k"})", *c)).status, 404);
}

TEST(Render, Decision) {
  test_rules c;
  decision d{.allowed = false, .limit = 3, .remaining = 0, .retry_after = 1500us, .reset_after = 60s};
  json j = json::parse(render_decision(c.named("ai"), d));
  EXPECT_EQ(j,
            json::parse(
                R"({"allowed":false,"rule":"ai","limit":3,"remaining":0,"retry_after_ms":2,"reset_after_ms":60000})"));
  decision dual{.allowed = false,
                .limit = 2,
                .remaining = 0,
                .retry_after = 1s,
                .reset_after = 60s,
                .dual_layer = true,
                .rejected_by = layer::tenant,
                .tenant = {10, 0},
                .user = {2, 1}};
  j = json::parse(render_decision(c.named("t"), dual));
  EXPECT_EQ(j["layers"], json::parse(R"({"tenant":{"limit":10,"remaining":0},"user":{"limit":2,"remaining":1}})"));
  EXPECT_EQ(j["rejected_by"], "tenant");
  EXPECT_FALSE(j.contains("source"));
  decision open{.allowed = true, .limit = 3, .remaining = 3, .source = decision_source::fail_open};
  EXPECT_EQ(json::parse(render_decision(c.named("ai"), open))["source"], "fail_open");
}

TEST(Render, ErrorEscapesAnything) {
  json j = json::parse(render_error({400, "invalid_request", "bad \"x\"\n\xff"}));
  EXPECT_EQ(j["error"]["code"], "invalid_request");
  EXPECT_TRUE(j["error"]["message"].is_string());
}

TEST(Render, Milliseconds) {
  EXPECT_EQ(http::ceil_milliseconds(0ns), 0);
  EXPECT_EQ(http::ceil_milliseconds(1ns), 1);
  EXPECT_EQ(http::ceil_milliseconds(1ms), 1);
  EXPECT_EQ(http::ceil_milliseconds(1001us), 2);
  EXPECT_EQ(http::ceil_milliseconds(never), 86'400'000);
}

TEST(Render, DisabledDecisionAdmitsWithFullCapacity) {
  test_rules c;
  decision d = disabled_decision(c.named("t"));
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.source, decision_source::disabled);
  EXPECT_EQ(d.remaining, 2);
  EXPECT_EQ(d.tenant.remaining, 10);
}

TEST(ApiErrorOf, ReadsTheConditions) {
  EXPECT_EQ(api_error_of(error(errc::backend_timeout, "t")).status, 503);
  EXPECT_EQ(api_error_of(error(errc::backend_timeout, "t")).code, "backend_timeout");
  EXPECT_EQ(api_error_of(error(errc::backend_unavailable, "t")).code, "backend_unavailable");
  EXPECT_EQ(api_error_of(error(errc::backend_overloaded, "t")).code, "backend_overloaded");
  EXPECT_EQ(api_error_of(error(errc::capacity_exhausted, "t")).status, 429);
  for (errc e : {errc::invalid_argument, errc::key_too_long, errc::cost_exceeds_burst, errc::unknown_rule}) {
    EXPECT_EQ(api_error_of(error(e, "t")).status, 400) << static_cast<int>(e);
    EXPECT_EQ(api_error_of(error(e, "t")).code, "invalid_request") << static_cast<int>(e);
  }
}

}  // namespace
}  // namespace sluice::server
