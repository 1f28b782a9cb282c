// SPDX-License-Identifier: Apache-2.0
// Rules from etcd over the file's: what is taken, what is rejected (once), what stays in force.
#include "rules/rule_sources.hpp"

#include <gtest/gtest.h>

namespace {

using namespace sluice;
using namespace sluice::server;

etcd_rules make(std::function<result<void>(const rule&)> check = [](const rule&) -> result<void> { return {}; }) {
  return etcd_rules("/sluice/", std::move(check));
}

rule file_rule(std::string name, std::int64_t limit) {
  return {.name = std::move(name), .limit = sliding_window_policy(limit, std::chrono::seconds(60))};
}

TEST(EtcdRules, ValidRuleIsTakenWithItsRevision) {
  auto rules = make();
  bool changed = false;
  auto rejected =
      rules.apply({{"rules/api", R"({"algorithm":"sliding_window","limit":100,"window":"60s"})", 7}}, changed);
  EXPECT_TRUE(rejected.empty());
  EXPECT_TRUE(changed);
  ASSERT_EQ(rules.rules().size(), 1u);
  const auto& e = rules.rules().at("api");
  EXPECT_EQ(e.key, "/sluice/rules/api");
  EXPECT_EQ(e.mod_revision, 7);
  EXPECT_EQ(e.definition.limit.limit, 100);
  EXPECT_EQ(e.definition.limit.window, std::chrono::seconds(60));
}

TEST(EtcdRules, BadValueIsRejectedOnceAndThePreviousVersionStays) {
  auto rules = make();
  bool changed = false;
  rules.apply({{"rules/api", R"({"algorithm":"token_bucket","rate":5,"burst":10})", 3}}, changed);
  auto rejected = rules.apply({{"rules/api", R"({"algorithm":"token_bucket","rate":5,"burst":-1})", 4}}, changed);
  ASSERT_EQ(rejected.size(), 1u);
  EXPECT_EQ(rejected[0].key, "/sluice/rules/api");
  EXPECT_EQ(rejected[0].mod_revision, 4);
  EXPECT_NE(rejected[0].reason.find("burst"), std::string::npos) << rejected[0].reason;
  EXPECT_NE(rejected[0].reason.find("mod_revision 4"), std::string::npos) << rejected[0].reason;
  EXPECT_FALSE(changed);
  EXPECT_EQ(rules.rules().at("api").mod_revision, 3);
  EXPECT_EQ(rules.rules().at("api").definition.limit.burst, 10);
  // Another key changes: the same bad version is not reported again.
  rejected = rules.apply({{"rules/api", R"({"algorithm":"token_bucket","rate":5,"burst":-1})", 4},
                          {"rules/other", R"({"algorithm":"fixed_window","limit":1,"window":1})", 5}},
                         changed);
  EXPECT_TRUE(rejected.empty());
  EXPECT_TRUE(changed);
  EXPECT_EQ(rules.rules().size(), 2u);
}

TEST(EtcdRules, AVersionTheWatcherLeftOutIsRejectedOnceAndThePreviousVersionStays) {
  auto rules = make();
  bool changed = false;
  rules.apply({{"rules/api", R"({"algorithm":"token_bucket","rate":5,"burst":10})", 3}}, changed);
  const std::string too_big = "value of 70000 bytes is over max_value_bytes (65536)";
  const std::vector<etcd_value> left_out = {{.key = "rules/api", .mod_revision = 4, .left_out = too_big},
                                            {.key = "rules/new", .mod_revision = 5, .left_out = too_big}};
  auto rejected = rules.apply(left_out, changed);
  ASSERT_EQ(rejected.size(), 2u);
  EXPECT_EQ(rejected[0].key, "/sluice/rules/api");
  EXPECT_EQ(rejected[0].mod_revision, 4);
  EXPECT_EQ(rejected[0].reason, "etcd /sluice/rules/api (mod_revision 4): " + too_big);
  EXPECT_EQ(rejected[1].key, "/sluice/rules/new");
  EXPECT_FALSE(changed) << "not a deletion: the rule in force stays";
  ASSERT_EQ(rules.rules().size(), 1u);
  EXPECT_EQ(rules.rules().at("api").mod_revision, 3);
  EXPECT_TRUE(rules.apply(left_out, changed).empty()) << "each version reported once";
}

TEST(EtcdRules, HostileValuesAreRejectedWithAReason) {
  auto rules = make();
  bool changed = false;
  const std::vector<etcd_value> values = {
      {"rules/a", "not json", 2},
      {"rules/b", "[1,2]", 3},
      {"rules/c", R"({"algorithm":"sliding_window","limit":{"x":1},"window":"60s"})", 4},
      {"rules/d", R"({"algorithm":"sliding_window","limit":18446744073709551615,"window":"60s"})", 5},
      {"rules/e", R"({"algorithm":"sliding_window","limit":10,"window":"60s","surprise":true})", 6},
      {"rules/bad name!", R"({"algorithm":"sliding_window","limit":10,"window":"60s"})", 7},
      {"rules/f", R"({"name":"g","algorithm":"sliding_window","limit":10,"window":"60s"})", 8},
      {"rules/h", "{\"algorithm\":\"sliding_window\",\"limit\":10,\"window\":\"60\xff\"}", 9},
      {"other/x", "{}", 10},
  };
  auto rejected = rules.apply(values, changed);
  EXPECT_EQ(rejected.size(), values.size());
  for (const auto& r : rejected) EXPECT_FALSE(r.reason.empty()) << r.key;
  EXPECT_TRUE(rules.rules().empty());
  EXPECT_FALSE(changed);
}

TEST(EtcdRules, RuleTheBackendRefusesIsRejected) {
  auto rules = make([](const rule& r) -> result<void> {
    if (r.limit.limit > 1000) return error(errc::invalid_argument, "too large for this backend");
    return {};
  });
  bool changed = false;
  auto rejected =
      rules.apply({{"rules/api", R"({"algorithm":"fixed_window","limit":5000,"window":"1s"})", 2}}, changed);
  ASSERT_EQ(rejected.size(), 1u);
  EXPECT_NE(rejected[0].reason.find("too large"), std::string::npos);
  EXPECT_TRUE(rules.rules().empty());
}

TEST(EtcdRules, DeletedKeyDisappears) {
  auto rules = make();
  bool changed = false;
  rules.apply({{"rules/api", R"({"algorithm":"fixed_window","limit":5,"window":"1s"})", 2}}, changed);
  rules.apply({}, changed);
  EXPECT_TRUE(changed);
  EXPECT_TRUE(rules.rules().empty());
}

TEST(EtcdRules, AtMostMaxRulesAreTaken) {
  auto rules = make();
  std::vector<std::string> names;
  for (std::size_t i = 0; i <= etcd_rules::max_rules; ++i) names.push_back("rules/r" + std::to_string(i));
  std::vector<etcd_value> values;
  for (const auto& n : names) values.push_back({n, R"({"algorithm":"fixed_window","limit":5,"window":"1s"})", 2});
  bool changed = false;
  auto rejected = rules.apply(values, changed);
  EXPECT_EQ(rules.rules().size(), etcd_rules::max_rules);
  ASSERT_EQ(rejected.size(), 1u);
  EXPECT_NE(rejected[0].reason.find("more than"), std::string::npos);
}

// New keys that sort before the ones in force neither push them out nor add to them past the cap,
// whether those in force are kept as they are, changed, or changed to a bad value.
TEST(EtcdRules, NewKeysNeverTakeTheCapPastMaxRules) {
  auto rules = make();
  const std::string good = R"({"algorithm":"fixed_window","limit":5,"window":"1s"})";
  std::vector<etcd_value> in_force;
  for (std::size_t i = 0; i < etcd_rules::max_rules; ++i) in_force.push_back({"rules/m" + std::to_string(i), good, 2});
  bool changed = false;
  ASSERT_TRUE(rules.apply(in_force, changed).empty());
  for (const std::string& same_changed_bad : {std::string("same"), std::string("changed"), std::string("bad")}) {
    std::vector<etcd_value> values;
    for (std::size_t i = 0; i < etcd_rules::max_rules; ++i) values.push_back({"rules/a" + std::to_string(i), good, 9});
    for (etcd_value v : in_force) {
      if (same_changed_bad != "same") v.mod_revision = 5;
      if (same_changed_bad == "bad") v.value = "{";
      values.push_back(v);
    }
    auto rejected = rules.apply(values, changed);
    EXPECT_EQ(rules.rules().size(), etcd_rules::max_rules) << same_changed_bad;
    EXPECT_TRUE(rules.rules().contains("m0")) << same_changed_bad;
    EXPECT_FALSE(rules.rules().contains("a0")) << same_changed_bad;
  }
}

TEST(MergeRules, EtcdOverridesTheFileByNameAndAddsItsOwn) {
  auto rules = make();
  bool changed = false;
  rules.apply({{"rules/api", R"({"algorithm":"fixed_window","limit":7,"window":"1s"})", 4},
               {"rules/zzz", R"({"algorithm":"fixed_window","limit":9,"window":"1s"})", 5}},
              changed);
  auto merged = merge_rules({file_rule("default", 1), file_rule("api", 2)}, &rules);
  ASSERT_EQ(merged.rules.size(), 3u);
  EXPECT_EQ(merged.rules[0].name, "default");
  EXPECT_EQ(merged.origins[0].source, "file");
  EXPECT_EQ(merged.rules[1].name, "api");
  EXPECT_EQ(merged.rules[1].limit.limit, 7);
  EXPECT_EQ(merged.origins[1].source, "etcd");
  EXPECT_EQ(merged.origins[1].mod_revision, 4);
  EXPECT_EQ(merged.rules[2].name, "zzz");
  // The etcd rule deleted: the file's rule of that name is back.
  rules.apply({}, changed);
  merged = merge_rules({file_rule("default", 1), file_rule("api", 2)}, &rules);
  ASSERT_EQ(merged.rules.size(), 2u);
  EXPECT_EQ(merged.rules[1].limit.limit, 2);
  EXPECT_EQ(merged.origins[1].source, "file");
}

}  // namespace
