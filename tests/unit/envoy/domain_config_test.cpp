// SPDX-License-Identifier: Apache-2.0
// envoyproxy/ratelimit's YAML, read as that service reads it, with sluice's extensions; every error
// names the file and line.
#include "envoy/domain_config.hpp"
#include "envoy/rls_rules.hpp"
#include "sluice/memory_backend.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace sluice::envoy {
namespace {

using namespace std::chrono_literals;

TEST(EnvoyDomainConfig, ReadsTheReferenceFormat) {
  auto d = parse_domain(R"(
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500
  - key: database
    value: default
    shadow_mode: true
    rate_limit:
      unit: MINUTE
      requests_per_unit: 50
  - key: remote_address
    detailed_metric: true
    descriptors:
      - key: path
        value: "/login*"
        rate_limit:
          name: login
          replaces: [{name: general}]
          unit: hour
          requests_per_unit: 10
      - key: bypass
        rate_limit: {unlimited: true}
)",
                        "mongo.yaml");
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_EQ(d->domain, "mongo_cps");
  ASSERT_EQ(d->descriptors.size(), 3u);
  const descriptor_config& users = d->descriptors[0];
  EXPECT_EQ(users.key, "database");
  EXPECT_EQ(users.value, "users");
  ASSERT_EQ(users.limits.size(), 1u);
  EXPECT_EQ(users.limits[0].unit, unit::second);
  EXPECT_EQ(users.limits[0].requests_per_unit, 500u);
  EXPECT_EQ(users.limits[0].to_policy(), fixed_window_policy(500, 1s)) << "fixed windows by default";
  EXPECT_TRUE(d->descriptors[1].shadow_mode);
  EXPECT_EQ(d->descriptors[1].limits[0].unit, unit::minute) << "units in any case";
  const descriptor_config& address = d->descriptors[2];
  EXPECT_TRUE(address.limits.empty());
  EXPECT_TRUE(address.detailed_metric);
  ASSERT_EQ(address.descriptors.size(), 2u);
  EXPECT_EQ(address.descriptors[0].limits[0].name, "login");
  EXPECT_EQ(address.descriptors[0].limits[0].replaces, std::vector<std::string>{"general"});
  EXPECT_TRUE(address.descriptors[1].limits[0].unlimited);
  EXPECT_EQ(address.descriptors[0].limits[0].where, "mongo.yaml:21");  // its first line
}

TEST(EnvoyDomainConfig, ReadsTheExtensions) {
  auto d = parse_domain(R"(
domain: api
descriptors:
  - key: user
    rate_limits:
      - {unit: second, requests_per_unit: 5, algorithm: token_bucket, burst: 20}
      - {unit: hour, requests_per_unit: 1000, algorithm: sliding_window}
      - {unit: minute, requests_per_unit: 100, window: 30s, algorithm: sliding_window_counter}
      - {requests_per_unit: 7, window: 250ms}
)",
                        "api.yaml");
  ASSERT_TRUE(d.ok()) << d.error().message;
  const auto& limits = d->descriptors[0].limits;
  ASSERT_EQ(limits.size(), 4u);
  EXPECT_EQ(limits[0].to_policy(), token_bucket_policy(per_second(5), 20));
  EXPECT_EQ(limits[1].to_policy(), sliding_window_policy(1000, 1h));
  EXPECT_EQ(limits[2].to_policy(), sliding_window_counter_policy(100, 30s));
  EXPECT_EQ(limits[3].to_policy(), fixed_window_policy(7, 250ms));
  EXPECT_EQ(limits[3].unit, unit::unknown);
}

TEST(EnvoyDomainConfig, UnitsAreTheReferenceServicesLengths) {
  EXPECT_EQ(unit_length(unit::second), 1s);
  EXPECT_EQ(unit_length(unit::week), std::chrono::hours(24 * 7));
  EXPECT_EQ(unit_length(unit::month), std::chrono::hours(24 * 30));
  EXPECT_EQ(unit_length(unit::year), std::chrono::hours(24 * 365));
  EXPECT_EQ(unit_length(unit::unknown), 0s);
}

TEST(EnvoyDomainConfig, ErrorsNameTheFileAndLine) {
  struct bad_case {
    const char* yaml;
    const char* message;  // a part of the error
  };
  const bad_case cases[] = {
      {"domain: a\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n",
       "f.yaml:5: duplicate descriptor key 'k' value 'v'"},
      {"domain: a\ndescriptors:\n  - key: k\n    colour: red\n", "f.yaml:4: unknown key 'colour' in a descriptor"},
      {"domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
       "f.yaml:4: unit must be second"},
      {"domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second}\n", "needs requests_per_unit"},
      {"domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
       "requests_per_unit must be an integer in 0..4294967295"},
      {"domain: a\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 3}\n", "needs a unit"},
      {"domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 3}\n",
       "burst is for algorithm: token_bucket only"},
      {"domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, window: 3 s}\n",
       "window must be a duration"},
      {"domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
       "    rate_limits: [{unit: second, requests_per_unit: 1}]\n",
       "rate_limit or rate_limits, not both"},
      {"domain: a\ndescriptors:\n  - value: v\n", "f.yaml:3: a descriptor needs a key"},
      {"descriptors: []\n", "needs a domain"},
      {"domain: ''\n", "domain must not be empty"},
      // What the reference refuses too.
      {"domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: "
       "}]}\n",
       "f.yaml:4: a replaces entry needs a name"},
      {"domain: a\ndescriptors:\n  - key: k\n    rate_limit: {name: me, unit: second, requests_per_unit: 1, "
       "replaces: [{name: me}]}\n",
       "rate_limit 'me' replaces itself"},
      {"domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: day, requests_per_unit: 5}\n",
       "f.yaml:4: an unlimited rate_limit has no unit"},
      {"domain: a\ndescriptors:\n  - key: k\n    value: exact\n    share_threshold: true\n",
       "f.yaml:5: share_threshold is for a value with a wildcard"},
      {"domain: a\ndescriptors:\n  - key: k\n    metadata: [1, 2]\n", "f.yaml:4: metadata must be a mapping"},
      {"domain: a\ndescriptors: [\n", "f.yaml:"},
      {"- just\n- a list\n", "the file must be a mapping"},
  };
  for (const bad_case& c : cases) {
    auto d = parse_domain(c.yaml, "f.yaml");
    ASSERT_FALSE(d.ok()) << c.yaml;
    EXPECT_EQ(d.error(), errc::config_invalid);
    EXPECT_NE(d.error().message.find(c.message), std::string::npos) << d.error().message;
  }
}

TEST(EnvoyDomainConfig, HostileFilesAreBounded) {
  std::string deep = "domain: a\ndescriptors:\n";
  std::string indent = "  ";
  for (int i = 0; i < max_descriptor_depth + 2; ++i) {
    deep += indent + "- key: k\n" + indent + "  descriptors:\n";
    indent += "    ";
  }
  deep += indent + "- key: last\n";
  auto d = parse_domain(deep, "deep.yaml");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.error().message.find("nest deeper than"), std::string::npos) << d.error().message;
  auto huge = parse_domain(std::string(max_config_file_bytes + 1, '#'), "huge.yaml");
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.error().message.find("larger than"), std::string::npos);
}

// Nesting deeper than max_yaml_depth is refused by a scan before yaml-cpp, whose scanner would hold
// every token of it (a million brackets in 2 MB cost hundreds of MB), naming the bound and the line.
TEST(EnvoyDomainConfig, DeepNestingIsRefusedBeforeParsing) {
  const std::string bound = "nest deeper than " + std::to_string(max_yaml_depth) + " levels";
  std::string compact = "domain: a\ndescriptors:\n  ";
  for (int i = 0; i < 500'000; ++i) compact += "- ";
  std::string indented = "domain: a\n";
  for (int i = 0; i < max_yaml_depth + 10; ++i) indented += std::string(static_cast<std::size_t>(i), ' ') + "k:\n";
  struct hostile {
    std::string yaml;
    std::string message;
  };
  for (const hostile& h :
       {hostile{"domain: a\ndescriptors: " + std::string(1'000'000, '['), "f.yaml:2: "},
        hostile{"domain: a\ndescriptors:\n  - {key: " + std::string(1'000'000, '{'), "f.yaml:3: "},
        hostile{compact, "f.yaml:3: "}, hostile{indented, "f.yaml:" + std::to_string(max_yaml_depth + 2) + ": "}}) {
    auto d = parse_domain(h.yaml, "f.yaml");
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.error().message, h.message + "collections " + bound) << h.yaml.substr(0, 80);
  }
}

// What only looks like nesting — brackets in quotes, comments, block scalars and plain values — is
// not counted, and the deepest config the descriptors allow passes the scan.
TEST(EnvoyDomainConfig, TheNestingScanCountsOnlyCollections) {
  const std::string brackets(200, '[');
  std::string yaml = "domain: a  # " + brackets + "\ndescriptors:\n";
  yaml += "  - key: quoted\n    value: \"" + brackets + "\\\"" + brackets + "\"\n";
  yaml += "  - key: single\n    value: '" + brackets + "''" + brackets + "'\n";
  yaml += "  - key: block\n    value: |\n      " + brackets + "\n      - - - - -\n";
  for (int i = 0; i < 100; ++i)
    yaml += "  - {key: plain" + std::to_string(i) + ", value: \"a[b\"}\n  - key: p" + std::to_string(i) +
            "\n    value: a[b{c\n";
  std::string indent = "  ";
  for (int i = 0; i < max_descriptor_depth; ++i) {
    yaml += indent + "- key: level" + std::to_string(i) + "\n" + indent +
            "  rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: x}], name: n" + std::to_string(i) +
            "}\n";
    if (i + 1 < max_descriptor_depth) yaml += indent + "  descriptors:\n";
    indent += "    ";
  }
  auto d = parse_domain(yaml, "f.yaml");
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_EQ(d->descriptors[0].value, brackets + "\"" + brackets);
  EXPECT_EQ(d->descriptors[1].value, brackets + "'" + brackets);
  EXPECT_EQ(d->descriptors[2].value, brackets + "\n- - - - -\n");
  EXPECT_EQ(d->descriptors[4].value, "a[b{c");
}

// A limit that replaces itself, or limits that replace each other, would turn each other off in
// every request they apply to: refused at load, naming the file and line.
TEST(EnvoyDomainConfig, ReplacesCyclesAreRefused) {
  auto self = parse_domain(R"(domain: a
descriptors:
  - key: k
    rate_limit: {name: x, replaces: [{name: x}], unit: second, requests_per_unit: 1}
)",
                           "f.yaml");
  ASSERT_FALSE(self.ok());
  EXPECT_EQ(self.error().message, "f.yaml:4: rate_limit 'x' replaces itself, which would turn it off");
  auto cycle = parse_domain(R"(domain: a
descriptors:
  - key: k1
    rate_limit: {name: a, replaces: [{name: b}], unit: second, requests_per_unit: 1}
  - key: k2
    rate_limit: {name: b, replaces: [{name: other}, {name: c}], unit: second, requests_per_unit: 1}
    descriptors:
      - key: k3
        rate_limit: {name: c, replaces: [{name: a}], unit: second, requests_per_unit: 1}
)",
                            "f.yaml");
  ASSERT_FALSE(cycle.ok());
  EXPECT_EQ(cycle.error().message,
            "f.yaml:9: replaces form a cycle ('a' replaces 'b' replaces 'c' replaces 'a'), which would turn these "
            "limits off");
  auto chain = parse_domain(R"(domain: a
descriptors:
  - key: k1
    rate_limit: {name: a, replaces: [{name: b}], unit: second, requests_per_unit: 1}
  - key: k2
    rate_limit: {name: b, replaces: [{name: c}], unit: second, requests_per_unit: 1}
  - key: k3
    rate_limit: {name: c, unit: second, requests_per_unit: 1}
  - key: k4
    rate_limit: {name: d, replaces: [{name: b}, {name: c}], unit: second, requests_per_unit: 1}
)",
                            "f.yaml");
  EXPECT_TRUE(chain.ok()) << chain.error().message;
}

// An anchor is walked at each alias: a list of replaces shared by many descriptors cannot make a
// small file cost a memory bomb.
TEST(EnvoyDomainConfig, AnchorsCountEachTimeTheyAreUsed) {
  std::string yaml =
      "domain: a\ndescriptors:\n  - key: k0\n    rate_limit:\n      name: n\n      unit: second\n"
      "      requests_per_unit: 1\n      replaces: &many\n";
  for (int i = 0; i < 1000; ++i) yaml += "        - {name: r" + std::to_string(i) + "}\n";
  for (int i = 1; i < 200; ++i)
    yaml += "  - key: k" + std::to_string(i) +
            "\n    rate_limit: {name: n, unit: second, requests_per_unit: 1, "
            "replaces: *many}\n";
  auto d = parse_domain(yaml, "f.yaml");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.error().message.find("more than " + std::to_string(max_limits_per_domain) + " rate limits"),
            std::string::npos)
      << d.error().message;
}

TEST(EnvoyDomainConfig, ADirectoryHoldsOneDomainPerFile) {
  const auto dir = std::filesystem::temp_directory_path() / ("sluice-envoy-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto write = [&](const char* name, const char* text) { std::ofstream(dir / name) << text; };
  write("b.yaml", "domain: b\n");
  write("a.yml", "domain: a\n");
  write("notes.txt", "not a config");
  auto all = load_domains(dir);
  ASSERT_TRUE(all.ok()) << all.error().message;
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].domain, "a");
  EXPECT_EQ((*all)[1].domain, "b");
  write("c.yaml", "domain: a\n");
  auto twice = load_domains(dir);
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.error().message.find("domain 'a' is also defined by"), std::string::npos) << twice.error().message;
  std::filesystem::remove_all(dir);
  EXPECT_FALSE(load_domains(dir).ok());
}

// What envoyproxy/ratelimit's files may hold beyond sluice's own use of the format: descriptors
// empty or null, a limit that replaces others without a name of its own, unlimited with a count,
// quota_mode, share_threshold, value_to_metric, and metadata (read, left unused, reported).
TEST(EnvoyDomainConfig, ReadsEverythingTheReferenceReads) {
  for (const char* empty : {"domain: a\n", "domain: a\ndescriptors:\n", "domain: a\ndescriptors: []\n",
                            "---\ndomain: a\ndescriptors:\n  - key: k\n    descriptors:\n"}) {
    auto d = parse_domain(empty, "f.yaml");
    ASSERT_TRUE(d.ok()) << empty << d.error().message;
    EXPECT_EQ(d->domain, "a");
  }
  auto d = parse_domain(R"(
domain: shop
descriptors:
  - key: cart
    value: checkout
    rate_limit:
      replaces: [{name: per_user}, {name: not_in_this_file}]
      unit: minute
      requests_per_unit: 4
  - key: user
    rate_limit: {name: per_user, unit: minute, requests_per_unit: 2}
  - key: bulk
    rate_limit: {unlimited: true, requests_per_unit: 9}
  - key: plan
    value: gold
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 100}
    metadata:
      owner: {team: billing}
  - key: file
    value: "img/*.png"
    share_threshold: true
    value_to_metric: true
    rate_limit: {unit: second, requests_per_unit: 10}
)",
                        "shop.yaml");
  ASSERT_TRUE(d.ok()) << d.error().message;
  const auto& ds = d->descriptors;
  ASSERT_EQ(ds.size(), 5u);
  EXPECT_EQ(ds[0].limits[0].name, "");
  EXPECT_EQ(ds[0].limits[0].replaces, (std::vector<std::string>{"per_user", "not_in_this_file"}));
  EXPECT_TRUE(ds[2].limits[0].unlimited);
  EXPECT_TRUE(ds[3].quota_mode);
  EXPECT_TRUE(ds[4].share_threshold);
  EXPECT_TRUE(ds[4].value_to_metric);
  EXPECT_FALSE(ds[3].share_threshold);
  ASSERT_EQ(d->ignored.size(), 1u);
  EXPECT_NE(d->ignored[0].find("shop.yaml:19: metadata"), std::string::npos) << d->ignored[0];
}

// With merge, the files of one domain add up (the reference's MERGE_DOMAIN_CONFIG); a descriptor
// both define is an error, naming the file that had it first.
TEST(EnvoyDomainConfig, FilesOfOneDomainMergeWhenAsked) {
  const auto dir = std::filesystem::temp_directory_path() / ("sluice-envoy-merge-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto write = [&](const char* name, const char* text) { std::ofstream(dir / name) << text; };
  write("1.yaml", "domain: a\ndescriptors:\n  - {key: k1, rate_limit: {unit: second, requests_per_unit: 1}}\n");
  write("2.yaml", "domain: a\ndescriptors:\n  - {key: k2, rate_limit: {unit: second, requests_per_unit: 2}}\n");
  EXPECT_FALSE(load_domains(dir).ok()) << "without merge, a domain is one file's";
  auto merged = load_domains(dir, true);
  ASSERT_TRUE(merged.ok()) << merged.error().message;
  ASSERT_EQ(merged->size(), 1u);
  ASSERT_EQ((*merged)[0].descriptors.size(), 2u);
  EXPECT_EQ((*merged)[0].descriptors[1].key, "k2");
  write("3.yaml", "domain: a\ndescriptors:\n  - {key: k1, rate_limit: {unit: second, requests_per_unit: 3}}\n");
  auto twice = load_domains(dir, true);
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.error().message.find("3.yaml:3: descriptor 'k1' of domain 'a' is also defined by"), std::string::npos)
      << twice.error().message;
  std::filesystem::remove_all(dir);
}

// The example shipped with sluiced loads and prepares.
TEST(EnvoyDomainConfig, TheExampleLoads) {
  auto all = load_domains(std::filesystem::path(SLUICE_EXAMPLES_DIR) / "envoy");
  ASSERT_TRUE(all.ok()) << all.error().message;
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ((*all)[0].domain, "edge");
  auto backend = make_memory_backend({}).value();
  counter_registry counters(10);
  auto rules = rls_rules::build(std::move(*all), *backend, nullptr, counters);
  ASSERT_TRUE(rules.ok()) << rules.error().message;
  EXPECT_EQ((*rules)->limit_count(), 5u);
}

}  // namespace
}  // namespace sluice::envoy
