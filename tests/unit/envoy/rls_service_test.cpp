// SPDX-License-Identifier: Apache-2.0
// ShouldRateLimit decided on the memory backend with a simulated clock: matching as
// envoyproxy/ratelimit matches, fixed windows aligned to the epoch, hits_addend, all or nothing
// across descriptors, shadow_mode, unlimited, replaces, overrides, reloads, unknown domains, hostile
// requests.
#include "envoy/rls_service.hpp"

#include <gtest/gtest.h>

#include <initializer_list>
#include <memory>
#include <sstream>
#include <utility>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "sluice/memory_backend.hpp"
#include "sluice/testing/simulated_clock.hpp"
#include "unit/envoy/requests.hpp"

namespace sluice::envoy {
namespace {

using namespace std::chrono_literals;
using testing::rls_request;

constexpr const char* config_yaml = R"(
domain: edge
descriptors:
  - key: database
    value: users
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: path
    value: "/login*"
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 2}
    descriptors:
      - key: path
        rate_limit: {unit: hour, requests_per_unit: 1}
  - key: tenant
    descriptors:
      - key: plan
        value: free
        rate_limit: {unit: day, requests_per_unit: 1}
  - key: shadowed
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: vip
    rate_limit: {unlimited: true}
  - key: two
    rate_limits:
      - {unit: second, requests_per_unit: 2}
      - {unit: hour, requests_per_unit: 3}
  - key: general
    rate_limit: {name: general, unit: hour, requests_per_unit: 100}
  - key: special
    rate_limit: {name: special, replaces: [{name: general}], unit: hour, requests_per_unit: 1}
)";

class EnvoyService : public ::testing::Test {
 protected:
  void SetUp() override { load(config_yaml); }

  void load(const char* yaml, rls_service* s = nullptr) {
    auto d = parse_domain(yaml, "edge.yaml");
    ASSERT_TRUE(d.ok()) << d.error().message;
    std::vector<domain_config> domains;
    domains.push_back(std::move(*d));
    rls_service& target = s ? *s : service_;
    auto r = rls_rules::build(std::move(domains), *backend_, target.rules().get(), target.counters());
    ASSERT_TRUE(r.ok()) << r.error().message;
    target.set_rules(std::move(*r));
  }

  pb::RateLimitResponse ask(const pb::RateLimitRequest& req, rls_service* s = nullptr) {
    pb::RateLimitResponse resp;
    grpc::Status status(grpc::StatusCode::UNKNOWN, "not answered");
    (s ? *s : service_).decide(req, resp, [&](grpc::Status st) { status = std::move(st); });
    EXPECT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(resp.statuses_size(), req.descriptors_size());
    return resp;
  }

  grpc::Status refused(const pb::RateLimitRequest& req) {
    pb::RateLimitResponse resp;
    grpc::Status status;
    service_.decide(req, resp, [&](grpc::Status st) { status = std::move(st); });
    return status;
  }

  // 12:00:10 UTC on a day: windows of a minute, an hour and a day are 50 s, 49 m 50 s and 11 h 59 m 50 s from their
  // ends.
  testing::simulated_clock clock_{time_point(std::chrono::seconds(1'700'000'000 / 86'400 * 86'400 + 12 * 3600 + 10))};
  std::unique_ptr<memory_backend> backend_ = make_memory_backend({.clock = &clock_}).value();
  rls_service service_{*backend_, {}};
};

TEST_F(EnvoyService, ExactValueCountsInFixedWindowsAlignedToTheEpoch) {
  auto req = rls_request({{{"database", "users"}}});
  for (std::uint32_t left : {2u, 1u, 0u}) {
    auto r = ask(req);
    EXPECT_EQ(r.overall_code(), pb::RateLimitResponse::OK);
    const auto& s = r.statuses(0);
    EXPECT_EQ(s.code(), pb::RateLimitResponse::OK);
    EXPECT_EQ(s.limit_remaining(), left);
    EXPECT_EQ(s.current_limit().requests_per_unit(), 3u);
    EXPECT_EQ(s.current_limit().unit(), pb::RateLimitResponse::RateLimit::MINUTE);
    EXPECT_EQ(s.duration_until_reset().seconds(), 50) << "the minute ends at :00";
  }
  auto over = ask(req);
  EXPECT_EQ(over.overall_code(), pb::RateLimitResponse::OVER_LIMIT);
  EXPECT_EQ(over.statuses(0).code(), pb::RateLimitResponse::OVER_LIMIT);
  EXPECT_EQ(over.statuses(0).limit_remaining(), 0u);
  clock_.advance(50s);  // the next minute
  EXPECT_EQ(ask(req).statuses(0).limit_remaining(), 2u);
}

TEST_F(EnvoyService, MatchingFollowsTheReferenceOrder) {
  // A prefix wildcard; each value its own counter.
  EXPECT_EQ(ask(rls_request({{{"path", "/login/a"}}})).statuses(0).limit_remaining(), 1u);
  EXPECT_EQ(ask(rls_request({{{"path", "/login/a"}}})).statuses(0).limit_remaining(), 0u);
  EXPECT_EQ(ask(rls_request({{{"path", "/login/b"}}})).statuses(0).limit_remaining(), 1u);
  // Key alone: each address its own counter; nested: the limit of the last entry.
  EXPECT_EQ(ask(rls_request({{{"remote_address", "10.0.0.1"}}})).statuses(0).limit_remaining(), 1u);
  EXPECT_EQ(ask(rls_request({{{"remote_address", "10.0.0.2"}}})).statuses(0).limit_remaining(), 1u);
  auto nested = ask(rls_request({{{"remote_address", "10.0.0.1"}, {"path", "/x"}}}));
  EXPECT_EQ(nested.statuses(0).current_limit().requests_per_unit(), 1u);
  EXPECT_EQ(nested.statuses(0).limit_remaining(), 0u);
  // A level without a limit at the last entry, and no match at all: OK, no limit.
  for (const auto& req : {rls_request({{{"tenant", "t1"}}}), rls_request({{{"tenant", "t1"}, {"plan", "paid"}}}),
                          rls_request({{{"nothing", "here"}}}), rls_request({{{"database", "users"}, {"deeper", "x"}}}),
                          rls_request({{{"database", "users"}}}, 0, "unknown-domain")}) {
    auto r = ask(req);
    EXPECT_EQ(r.overall_code(), pb::RateLimitResponse::OK);
    EXPECT_EQ(r.statuses(0).code(), pb::RateLimitResponse::OK);
    EXPECT_FALSE(r.statuses(0).has_current_limit()) << req.DebugString();
  }
  EXPECT_EQ(ask(rls_request({{{"tenant", "t1"}, {"plan", "free"}}})).statuses(0).limit_remaining(), 0u);
}

TEST_F(EnvoyService, HitsAddendAtBothLevels) {
  auto req = rls_request({{{"remote_address", "a"}}, {{"remote_address", "b"}}}, 2);
  req.mutable_descriptors(1)->mutable_hits_addend()->set_value(1);
  auto r = ask(req);
  EXPECT_EQ(r.statuses(0).limit_remaining(), 0u) << "the request's 2";
  EXPECT_EQ(r.statuses(1).limit_remaining(), 1u) << "the descriptor's own 1";
}

TEST_F(EnvoyService, ARefusedRequestConsumesNothing) {
  // "a" has 1 unit left, "b" 2; asking both for 2 refuses the request and takes from neither.
  ask(rls_request({{{"remote_address", "a"}}}));
  auto r = ask(rls_request({{{"remote_address", "a"}}, {{"remote_address", "b"}}}, 2));
  EXPECT_EQ(r.overall_code(), pb::RateLimitResponse::OVER_LIMIT);
  EXPECT_EQ(r.statuses(0).code(), pb::RateLimitResponse::OVER_LIMIT);
  EXPECT_EQ(r.statuses(1).code(), pb::RateLimitResponse::OK) << "it alone would pass";
  EXPECT_EQ(r.statuses(1).limit_remaining(), 2u) << "and it kept its quota";
  EXPECT_EQ(ask(rls_request({{{"remote_address", "b"}}}, 2)).statuses(0).limit_remaining(), 0u);
}

TEST_F(EnvoyService, IncrementEverythingAsTheReferenceDoes) {
  rls_service reference(*backend_, {.all_or_nothing = false});
  load(config_yaml, &reference);
  ask(rls_request({{{"remote_address", "a"}}}), &reference);
  auto r = ask(rls_request({{{"remote_address", "a"}}, {{"remote_address", "b"}}}, 2), &reference);
  EXPECT_EQ(r.overall_code(), pb::RateLimitResponse::OVER_LIMIT);
  EXPECT_EQ(r.statuses(1).limit_remaining(), 0u) << "b was counted though the request was refused";
}

// A descriptor's hits_addend of 0 looks at its counter and counts nothing (Envoy checks first and
// counts at the end of a stream, as in check-then-pay token quotas); once nothing is left, the look
// is OVER_LIMIT, so that such a setup limits.
TEST_F(EnvoyService, HitsAddendZeroLooksWithoutCounting) {
  ask(rls_request({{{"remote_address", "a"}}}));
  auto look = rls_request({{{"remote_address", "a"}}, {{"remote_address", "b"}}});
  look.mutable_descriptors(0)->mutable_hits_addend()->set_value(0);
  auto r = ask(look);
  EXPECT_EQ(r.overall_code(), pb::RateLimitResponse::OK);
  EXPECT_EQ(r.statuses(0).limit_remaining(), 1u) << "a's count, unchanged";
  EXPECT_GT(r.statuses(0).duration_until_reset().seconds(), 0);
  EXPECT_EQ(r.statuses(1).limit_remaining(), 1u);
  EXPECT_EQ(ask(rls_request({{{"remote_address", "a"}}})).statuses(0).limit_remaining(), 0u);
  // A look at a spent counter refuses, and still counts nothing (b keeps its unit).
  auto spent = ask(look);
  EXPECT_EQ(spent.overall_code(), pb::RateLimitResponse::OVER_LIMIT);
  EXPECT_EQ(spent.statuses(0).code(), pb::RateLimitResponse::OVER_LIMIT);
  EXPECT_EQ(spent.statuses(0).limit_remaining(), 0u);
  EXPECT_EQ(spent.statuses(1).code(), pb::RateLimitResponse::OK);
  EXPECT_EQ(ask(rls_request({{{"remote_address", "b"}}})).statuses(0).limit_remaining(), 0u)
      << "b's unit was still there";
}

TEST_F(EnvoyService, TwoDescriptorsOfOneCounterAskForTheirSum) {
  auto r = ask(rls_request({{{"remote_address", "a"}}, {{"remote_address", "a"}}}));
  EXPECT_EQ(r.statuses(0).limit_remaining(), 0u);
  EXPECT_EQ(r.statuses(1).limit_remaining(), 0u);
  EXPECT_EQ(ask(rls_request({{{"remote_address", "a"}}})).overall_code(), pb::RateLimitResponse::OVER_LIMIT);
}

TEST_F(EnvoyService, SeveralLimitsOnOneDescriptorAreAllOrNothing) {
  auto req = rls_request({{{"two", "x"}}});
  auto first = ask(req);
  EXPECT_EQ(first.statuses(0).limit_remaining(), 1u) << "the closest of the two limits";
  EXPECT_EQ(first.statuses(0).current_limit().unit(), pb::RateLimitResponse::RateLimit::SECOND);
  ask(req);
  auto refused = ask(req);  // the second's limit refuses: the hour's keeps its 1
  EXPECT_EQ(refused.overall_code(), pb::RateLimitResponse::OVER_LIMIT);
  EXPECT_EQ(refused.statuses(0).current_limit().unit(), pb::RateLimitResponse::RateLimit::SECOND);
  clock_.advance(1s);
  auto last = ask(req);
  EXPECT_EQ(last.overall_code(), pb::RateLimitResponse::OK);
  EXPECT_EQ(last.statuses(0).limit_remaining(), 0u);
  EXPECT_EQ(last.statuses(0).current_limit().unit(), pb::RateLimitResponse::RateLimit::HOUR);
  // Its units count once per request, whatever the number of its limits.
  std::string metrics;
  service_.append_metrics(metrics);
  EXPECT_NE(metrics.find("sluice_envoy_hits_total{domain=\"edge\",descriptor=\"two\"} 4"), std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("sluice_envoy_over_limit_total{domain=\"edge\",descriptor=\"two\"} 1"), std::string::npos);
  EXPECT_NE(metrics.find("sluice_envoy_within_limit_total{domain=\"edge\",descriptor=\"two\"} 3"), std::string::npos);
}

TEST_F(EnvoyService, ShadowModeCountsButNeverRefuses) {
  auto req = rls_request({{{"shadowed", "x"}}, {{"database", "users"}}});
  ask(req);
  auto r = ask(req);
  EXPECT_EQ(r.overall_code(), pb::RateLimitResponse::OK);
  EXPECT_EQ(r.statuses(0).code(), pb::RateLimitResponse::OK);
  EXPECT_EQ(r.statuses(0).limit_remaining(), 0u);
  EXPECT_EQ(r.statuses(1).limit_remaining(), 1u) << "and does not stop the others";
  std::string metrics;
  service_.append_metrics(metrics);
  EXPECT_NE(metrics.find("sluice_envoy_shadow_mode_total{domain=\"edge\",descriptor=\"shadowed\"} 1"),
            std::string::npos)
      << metrics;
}

// A look before a descriptor that counts on the same shadow_mode counter: the count still happens.
TEST_F(EnvoyService, ALookNeverTakesAnotherDescriptorsHits) {
  auto req = rls_request({{{"shadowed", "x"}}, {{"shadowed", "x"}}});
  req.mutable_descriptors(0)->mutable_hits_addend()->set_value(0);
  EXPECT_EQ(ask(req).statuses(1).limit_remaining(), 0u) << "the second descriptor's hit counted";
  auto look = rls_request({{{"shadowed", "x"}}});
  look.mutable_descriptors(0)->mutable_hits_addend()->set_value(0);
  EXPECT_EQ(ask(look).statuses(0).limit_remaining(), 0u);
}

TEST_F(EnvoyService, UnlimitedAndReplaces) {
  auto vip = ask(rls_request({{{"vip", "x"}}}, 1000));
  EXPECT_EQ(vip.statuses(0).code(), pb::RateLimitResponse::OK);
  EXPECT_EQ(vip.statuses(0).limit_remaining(), 4294967295u);
  // "special" replaces "general" in a request that has both.
  auto r = ask(rls_request({{{"general", "x"}}, {{"special", "x"}}}));
  EXPECT_FALSE(r.statuses(0).has_current_limit());
  EXPECT_EQ(r.statuses(1).current_limit().name(), "special");
  EXPECT_EQ(ask(rls_request({{{"general", "x"}}})).statuses(0).limit_remaining(), 99u) << "alone it applies";
}

TEST_F(EnvoyService, ARequestsOwnLimitReplacesTheConfigs) {
  auto req = rls_request({{{"anything", "x"}}});
  auto* limit = req.mutable_descriptors(0)->mutable_limit();
  limit->set_requests_per_unit(2);
  limit->set_unit(::envoy::extensions::common::ratelimit::v3::MINUTE);
  EXPECT_EQ(ask(req).statuses(0).limit_remaining(), 1u);
  limit->set_requests_per_unit(5);  // raised: the same counter, under the new limit
  EXPECT_EQ(ask(req).statuses(0).limit_remaining(), 3u);
  // Two overrides of one counter in one request: their sum, under the tighter.
  auto two = rls_request({{{"other", "y"}}, {{"other", "y"}}});
  for (std::uint32_t rpu : {5u, 3u}) {
    auto* l = two.mutable_descriptors(rpu == 5 ? 0 : 1)->mutable_limit();
    l->set_requests_per_unit(rpu);
    l->set_unit(::envoy::extensions::common::ratelimit::v3::MINUTE);
  }
  auto both = ask(two);
  EXPECT_EQ(both.statuses(0).limit_remaining(), 1u);
  EXPECT_EQ(both.statuses(1).limit_remaining(), 1u);
  EXPECT_EQ(both.statuses(1).current_limit().requests_per_unit(), 3u);
  limit->set_requests_per_unit(0);
  EXPECT_EQ(ask(req).overall_code(), pb::RateLimitResponse::OVER_LIMIT);
  // No unit, or a number outside the enum (proto enums are open): 257 is not SECOND.
  for (int u : {0, 8, 257, 263, -255}) {
    limit->set_unit(static_cast<::envoy::extensions::common::ratelimit::v3::RateLimitUnit>(u));
    EXPECT_EQ(refused(req).error_code(), grpc::StatusCode::INVALID_ARGUMENT) << u;
  }
}

TEST_F(EnvoyService, AReloadKeepsCountsAndARaisedLimitRaisesRemainingAtOnce) {
  auto req = rls_request({{{"database", "users"}}});
  ask(req);
  ask(req);
  std::string raised = config_yaml;
  raised.replace(raised.find("requests_per_unit: 3"), 20, "requests_per_unit: 10");
  load(raised.c_str());
  EXPECT_EQ(ask(req).statuses(0).limit_remaining(), 7u) << "2 used of 10";
}

TEST_F(EnvoyService, ResponseHeadersComeFromTheClosestDescriptor) {
  rls_service with_headers(*backend_, {.response_headers = true, .header_limit = "X-Limit"});
  load(config_yaml, &with_headers);
  auto r = ask(rls_request({{{"general", "x"}}, {{"database", "users"}}}), &with_headers);
  ASSERT_EQ(r.response_headers_to_add_size(), 3);
  EXPECT_EQ(r.response_headers_to_add(0).key(), "X-Limit");
  EXPECT_EQ(r.response_headers_to_add(0).value(), "3");
  EXPECT_EQ(r.response_headers_to_add(1).key(), "RateLimit-Remaining");
  EXPECT_EQ(r.response_headers_to_add(1).value(), "2");
  EXPECT_EQ(r.response_headers_to_add(2).key(), "RateLimit-Reset");
  EXPECT_EQ(r.response_headers_to_add(2).value(), "50");
  EXPECT_EQ(ask(rls_request({{{"general", "x"}}})).response_headers_to_add_size(), 0) << "off by default";
}

// A misspelt domain in Envoy's config limits nothing (as in the reference): it is counted apart
// from OK answers and logged once per domain, and a flood of random domains logs a bounded number
// of lines (the domains remembered are as bounded).
TEST_F(EnvoyService, UnknownDomainsAreCountedAndLoggedOncePerDomain) {
  auto log = std::make_shared<std::ostringstream>();
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(
      std::make_shared<spdlog::logger>("test", std::make_shared<spdlog::sinks::ostream_sink_mt>(*log)));
  for (int i = 0; i < 3; ++i) {
    auto r = ask(rls_request({{{"database", "users"}}}, 0, "egde"));
    EXPECT_EQ(r.overall_code(), pb::RateLimitResponse::OK);
    EXPECT_FALSE(r.statuses(0).has_current_limit());
  }
  ask(rls_request({{{"database", "users"}}}));
  const std::size_t flood = max_logged_unknown_domains + 500;
  for (std::size_t i = 0; i < flood; ++i) {
    const std::string domain = "random-" + std::to_string(i) + "\n\"x=1";
    ask(rls_request({{{"database", "other"}}}, 0, domain.c_str()));
  }
  spdlog::set_default_logger(previous);
  std::string metrics;
  service_.append_metrics(metrics);
  EXPECT_NE(metrics.find("sluice_envoy_requests_total{code=\"unknown_domain\"} " + std::to_string(3 + flood)),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("sluice_envoy_requests_total{code=\"ok\"} 1\n"), std::string::npos) << metrics;
  const std::string text = log->str();
  auto count = [&](const std::string& s) {
    std::size_t n = 0;
    for (auto at = text.find(s); at != std::string::npos; at = text.find(s, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("event=envoy_unknown_domain domain=egde "), 1u) << "once per domain";
  EXPECT_EQ(count("event=envoy_unknown_domain "), max_logged_unknown_domains) << "bounded";
  EXPECT_EQ(count("event=envoy_unknown_domains_not_logged "), 1u);
  EXPECT_NE(text.find("domain=\"random-0\\x0a\\\"x=1\""), std::string::npos) << "escaped: no forged line or field";
  EXPECT_EQ(count("\n"), max_logged_unknown_domains + 1);
}

TEST_F(EnvoyService, MalformedRequestsAreRefusedAndCountNothing) {
  auto over_hits = rls_request({{{"database", "users"}}});
  over_hits.mutable_descriptors(0)->mutable_hits_addend()->set_value(std::uint64_t{1} << 40);
  pb::RateLimitRequest many;
  many.set_domain("edge");
  for (int i = 0; i <= max_descriptors; ++i) many.add_descriptors()->add_entries()->set_key("database");
  pb::RateLimitRequest long_value = rls_request({{{"remote_address", "x"}}});
  long_value.mutable_descriptors(0)->mutable_entries(0)->set_value(std::string(600, 'v'));
  for (const auto& bad : {rls_request({{{"database", "users"}}}, 0, ""), pb::RateLimitRequest(),
                          rls_request({{{"", "users"}}}), over_hits, many, long_value}) {
    EXPECT_EQ(refused(bad).error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad.ShortDebugString().substr(0, 200);
  }
  EXPECT_EQ(ask(rls_request({{{"database", "users"}}})).statuses(0).limit_remaining(), 2u) << "nothing was counted";
  // Hits above the limit: over the limit for ever, and nothing else is counted.
  auto big = ask(rls_request({{{"database", "users"}}, {{"remote_address", "z"}}}, 5));
  EXPECT_EQ(big.overall_code(), pb::RateLimitResponse::OVER_LIMIT);
  EXPECT_EQ(ask(rls_request({{{"remote_address", "z"}}})).statuses(0).limit_remaining(), 1u) << "nothing was counted";
}

// As the reference: over the limit nothing is left (not the units a smaller request could still
// take), and the time to the reset is whole seconds, rounded up.
TEST_F(EnvoyService, OverTheLimitNothingIsLeftAndResetsAreWholeSeconds) {
  auto one = rls_request({{{"database", "users"}}});
  EXPECT_EQ(ask(one).statuses(0).limit_remaining(), 2u);
  clock_.advance(250ms);  // 49.75 s to the end of the minute
  auto over = ask(rls_request({{{"database", "users"}}}, 3));
  EXPECT_EQ(over.statuses(0).code(), pb::RateLimitResponse::OVER_LIMIT);
  EXPECT_EQ(over.statuses(0).limit_remaining(), 0u) << "2 are left, but not for this request";
  EXPECT_EQ(over.statuses(0).duration_until_reset().seconds(), 50);
  EXPECT_EQ(over.statuses(0).duration_until_reset().nanos(), 0);
  auto after = ask(one);
  EXPECT_EQ(after.statuses(0).limit_remaining(), 1u) << "the refused request took nothing";
  EXPECT_EQ(after.statuses(0).duration_until_reset().seconds(), 50);
  EXPECT_EQ(after.statuses(0).duration_until_reset().nanos(), 0);
}

// A descriptor without entries limits nothing and is answered OK, as the reference does; the
// request's other descriptors are decided as usual.
TEST_F(EnvoyService, ADescriptorWithoutEntriesIsOkWithNoLimit) {
  auto req = rls_request({{{"database", "users"}}});
  req.add_descriptors();  // no entries
  auto r = ask(req);
  EXPECT_EQ(r.overall_code(), pb::RateLimitResponse::OK);
  ASSERT_EQ(r.statuses_size(), 2);
  EXPECT_EQ(r.statuses(0).limit_remaining(), 2u);
  EXPECT_EQ(r.statuses(1).code(), pb::RateLimitResponse::OK);
  EXPECT_FALSE(r.statuses(1).has_current_limit());
  pb::RateLimitRequest only_empty;
  only_empty.set_domain("edge");
  only_empty.add_descriptors();
  EXPECT_EQ(ask(only_empty).overall_code(), pb::RateLimitResponse::OK);
}

// The metrics line of one counter family for one descriptor, or "" when absent.
std::string metric_line(const rls_service& s, const std::string& family, const std::string& descriptor) {
  std::string metrics;
  s.append_metrics(metrics);
  const std::string head = family + "{domain=\"edge\",descriptor=\"" + descriptor + "\"} ";
  const auto at = metrics.find(head);
  if (at == std::string::npos) return "";
  return metrics.substr(at + head.size(), metrics.find('\n', at) - at - head.size());
}

// As the reference counts them: of a request that crosses the limit only the units past it are
// over_limit, and the units past near_limit_ratio (0.8) of the limit and within it near_limit.
TEST_F(EnvoyService, OverAndNearLimitCountOnlyTheUnitsPastTheirThresholds) {
  load(R"(
domain: edge
descriptors:
  - key: ten
    rate_limit: {unit: hour, requests_per_unit: 10}
)");
  const auto req = [](std::uint32_t hits) { return rls_request({{{"ten", "x"}}}, hits); };
  EXPECT_EQ(ask(req(7)).overall_code(), pb::RateLimitResponse::OK);  // 0 -> 7: under 8, not near
  EXPECT_EQ(metric_line(service_, "sluice_envoy_near_limit_total", "ten"), "0");
  EXPECT_EQ(ask(req(2)).overall_code(), pb::RateLimitResponse::OK);  // 7 -> 9: 1 unit past 8
  EXPECT_EQ(metric_line(service_, "sluice_envoy_near_limit_total", "ten"), "1");
  EXPECT_EQ(ask(req(4)).overall_code(), pb::RateLimitResponse::OVER_LIMIT);  // 9 -> 13: 3 past 10, 1 near
  EXPECT_EQ(metric_line(service_, "sluice_envoy_over_limit_total", "ten"), "3");
  EXPECT_EQ(metric_line(service_, "sluice_envoy_near_limit_total", "ten"), "2");
  EXPECT_EQ(metric_line(service_, "sluice_envoy_within_limit_total", "ten"), "9");
  EXPECT_EQ(metric_line(service_, "sluice_envoy_hits_total", "ten"), "13");
  EXPECT_EQ(ask(req(1)).overall_code(), pb::RateLimitResponse::OK) << "the refused 4 took nothing";
  EXPECT_EQ(ask(req(1)).overall_code(), pb::RateLimitResponse::OVER_LIMIT);  // at 10 already: all of it over
  EXPECT_EQ(metric_line(service_, "sluice_envoy_over_limit_total", "ten"), "4");
}

TEST_F(EnvoyService, TheNearLimitRatioIsASetting) {
  rls_service half(*backend_, {.near_limit_ratio = 0.5});
  load(R"(
domain: edge
descriptors:
  - key: ten
    rate_limit: {unit: hour, requests_per_unit: 10}
)",
       &half);
  ask(rls_request({{{"ten", "x"}}}, 7), &half);
  EXPECT_EQ(metric_line(half, "sluice_envoy_near_limit_total", "ten"), "2");
}

// quota_mode descriptors refuse a request only when all of them are over their limits; each still
// says OVER_LIMIT in its status.
TEST_F(EnvoyService, QuotaModeRefusesOnlyWhenEveryQuotaIsSpent) {
  load(R"(
domain: edge
descriptors:
  - key: quota_a
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: quota_b
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: strict
    rate_limit: {unit: hour, requests_per_unit: 5}
)");
  const auto req = rls_request({{{"quota_a", "x"}}, {{"quota_b", "x"}}, {{"strict", "x"}}});
  EXPECT_EQ(ask(req).overall_code(), pb::RateLimitResponse::OK);
  auto one_spent = ask(req);
  EXPECT_EQ(one_spent.overall_code(), pb::RateLimitResponse::OK) << "quota_b still had a unit";
  EXPECT_EQ(one_spent.statuses(0).code(), pb::RateLimitResponse::OVER_LIMIT);
  EXPECT_EQ(one_spent.statuses(1).code(), pb::RateLimitResponse::OK);
  auto both_spent = ask(req);
  EXPECT_EQ(both_spent.overall_code(), pb::RateLimitResponse::OVER_LIMIT);
  EXPECT_EQ(both_spent.statuses(2).code(), pb::RateLimitResponse::OK);
  // Every descriptor in quota mode ([envoy] quota_mode): strict alone no longer refuses.
  rls_service quota(*backend_, {.quota_mode = true});
  load(R"(
domain: edge
descriptors:
  - key: strict
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: loose
    rate_limit: {unit: hour, requests_per_unit: 9}
)",
       &quota);
  const auto pair = rls_request({{{"strict", "y"}}, {{"loose", "y"}}});
  ask(pair, &quota);
  EXPECT_EQ(ask(pair, &quota).overall_code(), pb::RateLimitResponse::OK);
}

// [envoy] shadow_mode answers OK where the request would be refused, and counts it.
TEST_F(EnvoyService, GlobalShadowModeAnswersOk) {
  rls_service shadow(*backend_, {.shadow_mode = true});
  load(config_yaml, &shadow);
  const auto req = rls_request({{{"database", "users"}}}, 3);
  ask(req, &shadow);
  auto r = ask(req, &shadow);
  EXPECT_EQ(r.overall_code(), pb::RateLimitResponse::OK);
  EXPECT_EQ(r.statuses(0).code(), pb::RateLimitResponse::OVER_LIMIT) << "the descriptor still says so";
  std::string metrics;
  shadow.append_metrics(metrics);
  EXPECT_NE(metrics.find("sluice_envoy_global_shadow_mode_total 1"), std::string::npos) << metrics;
}

// A '*' anywhere in a value matches any run of characters, none included, as the reference's.
TEST_F(EnvoyService, WildcardsMatchAnywhereInAValue) {
  load(R"(
domain: edge
descriptors:
  - key: route
    value: "svc*rpc*v2"
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: tail
    value: "ab*b"
    rate_limit: {unit: hour, requests_per_unit: 1}
)");
  for (const char* v : {"svcrpcv2", "svc.users.rpc.get.v2", "svc-rpc-rpc-v2"}) {
    EXPECT_TRUE(ask(rls_request({{{"route", v}}})).statuses(0).has_current_limit()) << v;
  }
  for (const char* v : {"svc.v2.rpc", "xsvcrpcv2", "svcrpcv2x", "svc"}) {
    EXPECT_FALSE(ask(rls_request({{{"route", v}}})).statuses(0).has_current_limit()) << v;
  }
  EXPECT_TRUE(ask(rls_request({{{"tail", "abb"}}})).statuses(0).has_current_limit());
  EXPECT_FALSE(ask(rls_request({{{"tail", "ab"}}})).statuses(0).has_current_limit()) << "'ab' and 'b' overlap";
  EXPECT_TRUE(wildcard_match({"a", "", "c"}, "a_c"));
  EXPECT_FALSE(wildcard_match({"abc"}, "abcd"));
}

// share_threshold: every value a wildcard matches counts on one counter; without it each value has
// its own. value_to_metric names the stats by the request's value.
TEST_F(EnvoyService, ShareThresholdValuesShareOneCounter) {
  load(R"(
domain: edge
descriptors:
  - key: shared
    value: "files/*"
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: apart
    value: "files/*"
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: named
    value_to_metric: true
    rate_limit: {unit: hour, requests_per_unit: 5}
)");
  EXPECT_EQ(ask(rls_request({{{"shared", "files/a"}}})).statuses(0).limit_remaining(), 1u);
  EXPECT_EQ(ask(rls_request({{{"shared", "files/b"}}})).statuses(0).limit_remaining(), 0u);
  EXPECT_EQ(ask(rls_request({{{"shared", "files/c"}}})).overall_code(), pb::RateLimitResponse::OVER_LIMIT);
  EXPECT_EQ(ask(rls_request({{{"apart", "files/a"}}})).statuses(0).limit_remaining(), 1u);
  EXPECT_EQ(ask(rls_request({{{"apart", "files/b"}}})).statuses(0).limit_remaining(), 1u);
  EXPECT_EQ(metric_line(service_, "sluice_envoy_hits_total", "shared_files/*"), "3");
  ask(rls_request({{{"named", "alice"}}}));
  EXPECT_EQ(metric_line(service_, "sluice_envoy_hits_total", "named_alice"), "1");
  EXPECT_EQ(metric_line(service_, "sluice_envoy_hits_total", "named"), "0") << "counted under the value instead";
}

// A request's own limit counts under its entries, as the reference keys its stats.
TEST_F(EnvoyService, ARequestsOwnLimitIsCountedUnderItsEntries) {
  auto req = rls_request({{{"anything", "x"}, {"more", ""}}});
  auto* limit = req.mutable_descriptors(0)->mutable_limit();
  limit->set_requests_per_unit(2);
  limit->set_unit(::envoy::extensions::common::ratelimit::v3::MINUTE);
  ask(req);
  EXPECT_EQ(metric_line(service_, "sluice_envoy_hits_total", "anything_x.more"), "1");
}

}  // namespace
}  // namespace sluice::envoy
