// SPDX-License-Identifier: Apache-2.0
#include "sluice/server/config.hpp"

#include <gtest/gtest.h>

#include <algorithm>

#include <chrono>
#include <string>

namespace sluice::server {
namespace {

using namespace std::chrono_literals;

constexpr const char* seed = R"([ratelimit]
enabled = true
algorithm = "sliding_window"   # token_bucket | sliding_window
token_rate = 10                # token bucket: tokens per second
token_burst = 20               # token bucket: bucket size
window = 60                    # sliding window: seconds
limit = 100                    # sliding window: requests per window
)";

std::string replace(std::string s, const std::string& from, const std::string& to) {
  auto at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) s.replace(at, from.size(), to);
  return s;
}

// Expects a config error whose message starts with `prefix` (file:line:column: ...).
void expect_error(const std::string& text, const std::string& prefix) {
  auto c = parse_config(text, "t.toml");
  ASSERT_FALSE(c.ok()) << text;
  EXPECT_EQ(c.error(), errc::config_invalid);
  EXPECT_EQ(c.error().message.substr(0, prefix.size()), prefix) << c.error().message;
}

TEST(Config, SeedSectionDefinesDefaultRule) {
  auto c = parse_config(seed, "seed.toml");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_TRUE(c->enabled);
  ASSERT_EQ(c->rules.size(), 1u);
  EXPECT_EQ(c->rules[0], (rule{.name = "default", .limit = sliding_window_policy(100, 60s), .tenant = std::nullopt}));
  EXPECT_EQ(c->backend.type, backend_type::memory);
  EXPECT_EQ(c->server.listen, "127.0.0.1:8080");
}

TEST(Config, SeedTokenBucket) {
  auto c = parse_config(replace(seed, "\"sliding_window\"", "\"token_bucket\""), "seed.toml");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->rules[0].limit, token_bucket_policy(per_second(10), 20));
}

TEST(Config, FullForm) {
  auto c = parse_config(R"(
[server]
listen = "0.0.0.0:9090"
threads = 3
log_rejections = true

[backend]
type = "redis"
addresses = ["10.0.0.1:6379", "10.0.0.2:6380"]
username = "u"
password = "p"
key_prefix = "x:"
timeout_ms = 20
on_error = "local"

[http]
ietf_headers = true
legacy_headers = false

[[rules]]
name = "api"
algorithm = "token_bucket"
rate = 5
burst = 60

[[rules]]
name = "ai"
algorithm = "sliding_window"
limit = 100
window = "60s"

[[rules]]
name = "tenant_api"
algorithm = "sliding_window"
window = "60s"
tenant_limit = 1000
user_limit = 100

[[rules]]
name = "q"
algorithm = "fixed_window"
limit = 7
window = "1d"

[[rules]]
name = "c"
algorithm = "sliding_window_counter"
limit = 7
window = "250ms"
)",
                        "full.toml");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->server.listen, "0.0.0.0:9090");
  EXPECT_EQ(c->server.threads, 3u);
  EXPECT_TRUE(c->server.log_rejections);
  EXPECT_EQ(c->backend.type, backend_type::redis);
  EXPECT_EQ(c->backend.redis.addresses, (std::vector<std::string>{"10.0.0.1:6379", "10.0.0.2:6380"}));
  EXPECT_EQ(c->backend.redis.username, "u");
  EXPECT_EQ(c->backend.redis.password, "p");
  EXPECT_EQ(c->backend.redis.key_prefix, "x:");
  EXPECT_EQ(c->backend.redis.command_timeout, 20ms);
  EXPECT_EQ(c->backend.redis.on_error, failure_policy::local);
  EXPECT_TRUE(c->http.ietf_headers);
  EXPECT_FALSE(c->http.legacy_headers);
  ASSERT_EQ(c->rules.size(), 5u);
  EXPECT_EQ(c->rules[0].limit, token_bucket_policy(per_second(5), 60));
  EXPECT_EQ(c->rules[1].limit, sliding_window_policy(100, 60s));
  EXPECT_TRUE(c->rules[2].is_dual_layer());
  EXPECT_EQ(c->rules[2].limit, sliding_window_policy(100, 60s));
  EXPECT_EQ(*c->rules[2].tenant, sliding_window_policy(1000, 60s));
  EXPECT_EQ(c->rules[3].limit, fixed_window_policy(7, 24h));
  EXPECT_EQ(c->rules[4].limit, sliding_window_counter_policy(7, 250ms));
}

TEST(Config, BothFormsInOneFile) {
  auto c = parse_config(
      std::string(seed) + "\n[[rules]]\nname = \"api\"\nalgorithm = \"token_bucket\"\nrate = 1.5\nburst = 3\n",
      "both.toml");
  ASSERT_TRUE(c.ok()) << c.error().message;
  ASSERT_EQ(c->rules.size(), 2u);
  EXPECT_EQ(c->rules[0].name, "default");
  EXPECT_EQ(c->rules[1].limit, token_bucket_policy(per_second(1.5), 3));
}

TEST(Config, EnabledFalse) {
  auto c = parse_config(replace(seed, "enabled = true", "enabled = false"), "t.toml");
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->enabled);
  auto only = parse_config("[ratelimit]\nenabled = false\n", "t.toml");
  ASSERT_TRUE(only.ok()) << only.error().message;
  EXPECT_TRUE(only->rules.empty());
}

TEST(Config, Durations) {
  EXPECT_EQ(*parse_duration("250ms"), 250ms);
  EXPECT_EQ(*parse_duration("60s"), 60s);
  EXPECT_EQ(*parse_duration("5m"), 5min);
  EXPECT_EQ(*parse_duration("1h"), 1h);
  EXPECT_EQ(*parse_duration("1d"), 24h);
  for (const char* bad : {"", "s", "60", "60 s", "-1s", "1.5s", "1w", "99999999999999d", "1S", " 1s"}) {
    EXPECT_FALSE(parse_duration(bad).ok()) << bad;
  }
}

TEST(Config, ErrorsNameFileLineAndColumn) {
  expect_error(std::string(seed) + "bogus = 1\n", "t.toml:8:1: unknown key 'bogus' in [ratelimit]");
  expect_error("[nope]\n", "t.toml:1:2: unknown key 'nope'");
  expect_error(replace(seed, "limit = 100 ", "limit = \"x\""), "t.toml:7:9: limit must be an integer");
  expect_error(replace(seed, "limit = 100 ", "limit = 0  "), "t.toml:7:9: limit must be between 1 and");
  expect_error(replace(seed, "limit = 100 ", "limit = 1.5"), "t.toml:7:9: limit must be an integer");
  expect_error(replace(seed, "window = 60 ", "window = 0  "), "t.toml:6:10: window must be between 1 and");
  expect_error(replace(seed, "window = 60 ", "window = \"0s\""), "t.toml:6:10: window must be between 1ms");
  expect_error(replace(seed, "window = 60 ", "window = \"60x\""), "t.toml:6:10: window must be a duration");
  expect_error(replace(seed, "window = 60 ", "window = true"), "t.toml:6:10: window must be an integer number");
  expect_error(replace(seed, "\"sliding_window\"", "\"leaky\""), "t.toml:3:13: algorithm must be token_bucket");
  expect_error(replace(seed, "enabled = true", "enabled = 1"), "t.toml:2:11: enabled must be a boolean");
  expect_error(replace(seed, "limit = 100 ", "#"), "t.toml:1:1: [ratelimit] is missing 'limit'");
  expect_error("[ratelimit\n", "t.toml:1:");
  expect_error("", "t.toml:1:1: no rules");
  expect_error("ratelimit = 3\n", "t.toml:1:13: ratelimit must be a table");
}

TEST(Config, RuleErrors) {
  const std::string api = "[[rules]]\nname = \"api\"\nalgorithm = \"token_bucket\"\nrate = 5\nburst = 60\n";
  expect_error(api + api, "t.toml:7:8: duplicate rule name \"api\"");
  expect_error(replace(api, "burst = 60", "burst = -1"), "t.toml:5:9: burst must be between 1");
  expect_error(replace(api, "rate = 5", "rate = 0"), "t.toml:4:8: rate must be a number > 0");
  expect_error(replace(api, "rate = 5", "rate = nan"), "t.toml:4:8: rate must be a number > 0");
  expect_error(replace(api, "rate = 5", "rate = inf"), "t.toml:4:8: rate must be a number > 0");
  expect_error(replace(api, "rate = 5", "window = 5"),
               "t.toml:4:1: unknown key 'window' in [[rules]] (algorithm token_bucket");
  expect_error(replace(api, "rate = 5\n", ""), "t.toml:1:1: [[rules]] is missing 'rate'");
  expect_error(replace(api, "name = \"api\"", "name = \"a b\""), "t.toml:2:8: name must be 1 to 64 characters");
  expect_error(replace(api, "name = \"api\"\n", ""), "t.toml:1:1: [[rules]] is missing 'name'");
  expect_error(std::string(seed) + replace(api, "\"api\"", "\"default\""),
               "t.toml:9:8: duplicate rule name \"default\"");
  const std::string dual =
      "[[rules]]\nname = \"d\"\nalgorithm = \"sliding_window\"\nwindow = 60\ntenant_limit = 10\nuser_limit = 5\n";
  ASSERT_TRUE(parse_config(dual, "t.toml").ok());
  expect_error(replace(dual, "user_limit = 5\n", ""), "t.toml:1:1: [[rules]] is missing 'user_limit'");
  expect_error(dual + "limit = 3\n", "t.toml:7:1: unknown key 'limit' in [[rules]] (a dual-layer rule");
  expect_error("rules = [1]\n", "t.toml:1:10: each entry of rules must be a table");
  // As many rules as etcd may add, and no more (each one is looked up by name on every check).
  std::string most;
  for (std::size_t i = 0; i < max_file_rules; ++i) most += replace(api, "\"api\"", "\"r" + std::to_string(i) + "\"");
  auto c = parse_config(most, "t.toml");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->rules.size(), max_file_rules);
  expect_error(most + api, "t.toml:1:1: more than 1024 rules");
}

// lease = "200ms" serves a rule from leases (on Redis); lease_max_share caps what one instance holds.
TEST(Config, RuleLeases) {
  const std::string quota = "[[rules]]\nname = \"q\"\nalgorithm = \"fixed_window\"\nlimit = 100\nwindow = \"1m\"\n";
  auto c = parse_config(quota + "lease = \"250ms\"\nlease_max_share = 0.2\n", "t.toml");
  ASSERT_TRUE(c.ok()) << c.error().message;
  const rule& r = c->rules.back();
  ASSERT_TRUE(r.lease.has_value());
  EXPECT_EQ(r.lease->period, std::chrono::milliseconds(250));
  EXPECT_DOUBLE_EQ(r.lease->max_share, 0.2);
  auto plain = parse_config(quota, "t.toml");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->rules.back().lease.has_value());
  expect_error(quota + "lease = \"1ms\"\n", "t.toml:6:9: lease rule 'q': lease period must be 10 ms to 10 s");
  expect_error(quota + "lease = \"1s\"\nlease_max_share = 0.9\n", "t.toml:7:19: lease_max_share must be");
  expect_error(quota + "lease_max_share = 0.1\n", "t.toml:6:19: lease_max_share needs lease");
  expect_error(replace(quota, "fixed_window", "sliding_window") + "lease = \"1s\"\n",
               "t.toml:6:9: lease rule 'q': a sliding_window (log) cannot be leased");
  auto json = parse_rule_json("api", R"({"algorithm":"token_bucket","rate":5,"burst":10,"lease":"100ms"})", "e");
  ASSERT_TRUE(json.ok()) << json.error().message;
  EXPECT_EQ(json->lease->period, std::chrono::milliseconds(100));
}

// window = "calendar_month" (and _week, _day): a fixed window on the UTC calendar.
TEST(Config, CalendarWindows) {
  const std::string quota = "[[rules]]\nname = \"q\"\nalgorithm = \"fixed_window\"\nlimit = 100\n";
  for (calendar c : {calendar::day, calendar::week, calendar::month}) {
    auto cfg = parse_config(quota + "window = \"" + std::string(to_string(c)) + "\"\n", "t.toml");
    ASSERT_TRUE(cfg.ok()) << cfg.error().message;
    EXPECT_EQ(cfg->rules.back().limit, calendar_window_policy(100, c));
  }
  auto dual = parse_config(
      "[[rules]]\nname = \"d\"\nalgorithm = \"fixed_window\"\nwindow = \"calendar_week\"\ntenant_limit = 9\n"
      "user_limit = 3\n",
      "t.toml");
  ASSERT_TRUE(dual.ok()) << dual.error().message;
  EXPECT_EQ(*dual->rules.back().tenant, calendar_window_policy(9, calendar::week));
  EXPECT_EQ(dual->rules.back().limit, calendar_window_policy(3, calendar::week));
  expect_error(quota + "window = \"calendar_year\"\n", "t.toml:5:10: window must be calendar_day, calendar_week or");
  expect_error(replace(quota, "fixed_window", "sliding_window") + "window = \"calendar_day\"\n",
               "t.toml:5:10: window calendar_day is for algorithm fixed_window only");
  expect_error(quota + "window = \"calendar_month\"\nlease = \"1s\"\n",
               "t.toml:6:9: lease rule 'q': a calendar window cannot be leased");
}

// shadow = true: the rule's refusals are counted and admitted; admin_token turns POST /v1/reset on.
TEST(Config, ShadowRulesAndAdminToken) {
  const std::string quota = "[[rules]]\nname = \"q\"\nalgorithm = \"fixed_window\"\nlimit = 100\nwindow = \"1m\"\n";
  auto c = parse_config(quota + "shadow = true\n", "t.toml");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_TRUE(c->rules.back().shadow);
  EXPECT_FALSE(parse_config(quota, "t.toml")->rules.back().shadow);
  expect_error(quota + "shadow = \"yes\"\n", "t.toml:6:10: shadow must be");
  auto json = parse_rule_json("api", R"({"algorithm":"token_bucket","rate":5,"burst":10,"shadow":true})", "e");
  ASSERT_TRUE(json.ok()) << json.error().message;
  EXPECT_TRUE(json->shadow);

  const std::string s = std::string(seed);
  auto t = parse_config(s + "[server]\nadmin_token = \"0123456789abcdef\"\n", "t.toml");
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(t->server.admin_token, "0123456789abcdef");
  EXPECT_EQ(parse_config(s, "t.toml")->server.admin_token, "");
  expect_error(s + "[server]\nadmin_token = \"short\"\n", "t.toml:9:15: admin_token must be 16 to 256");
  expect_error(s + "[server]\nadmin_token = \"with a space 0123456\"\n", "t.toml:9:15: admin_token must be");
}

TEST(Config, ServerBackendHttpErrors) {
  const std::string s = std::string(seed);
  expect_error(s + "[server]\nlisten = \"nohost\"\n", "t.toml:9:10: listen must be \"host:port\"");
  expect_error(s + "[server]\nlisten = \"h:70000\"\n", "t.toml:9:10: listen must be");
  expect_error(s + "[server]\nthreads = -1\n", "t.toml:9:11: threads must be between 0 and 256");
  expect_error(s + "[backend]\ntype = \"etcd\"\n",
               "t.toml:9:8: type must be memory, redis, redis_cluster or redis_sentinel");
  expect_error(s + "[backend]\non_error = \"maybe\"\n", "t.toml:9:12: on_error must be allow, deny or local");
  expect_error(s + "[backend]\naddresses = \"a:1\"\n", "t.toml:9:13: addresses must be an array");
  expect_error(s + "[backend]\naddresses = [\"a:1\", 2]\n", "t.toml:9:21: each address must be");
  expect_error(s + "[backend]\ntimeout_ms = 0\n", "t.toml:9:14: timeout_ms must be between 1");
  expect_error(s + "[backend]\nusername = \"u\"\n", "t.toml:9:12: username needs a password");
  expect_error(s + "[http]\nietf_headers = \"yes\"\n", "t.toml:9:16: ietf_headers must be a boolean");
  expect_error(s + "[http]\nietf = true\n", "t.toml:9:1: unknown key 'ietf' in [http]");
}

// Every option of the Redis backend is read from [backend] into backend_settings::redis; what a
// file leaves out keeps redis_options's default.
TEST(Config, BackendHoldsEveryRedisOption) {
  auto c = parse_config(R"([backend]
type = "redis"
addresses = ["10.0.0.1:6379", "unix:/run/redis.sock"]
username = "u"
password = "p"
database = 3
key_prefix = "app:"
timeout_ms = 20
connect_timeout_ms = 300
on_error = "deny"
max_pending = 77
breaker_failure_threshold = 9
breaker_probe_interval_ms = 750
error_log_interval_ms = 0
cluster_refresh_interval_ms = 2500
max_batch = 16
max_keys_per_rule = 5000
tls = true
tls_ca_file = "/etc/ssl/redis-ca.pem"
tls_ca_dir = "/etc/ssl/redis-cas"
tls_cert_file = "/etc/sluice/client.pem"
tls_key_file = "/etc/sluice/client.key"
tls_server_name = "redis.internal"
tls_verify = false
wait_replicas = 1

[[rules]]
name = "api"
algorithm = "fixed_window"
limit = 5
window = 60
)",
                        "b.toml");
  ASSERT_TRUE(c.ok()) << c.error().message;
  const redis_options& r = c->backend.redis;
  EXPECT_EQ(r.addresses, (std::vector<std::string>{"10.0.0.1:6379", "unix:/run/redis.sock"}));
  EXPECT_EQ(r.username, "u");
  EXPECT_EQ(r.password, "p");
  EXPECT_EQ(r.database, 3);
  EXPECT_EQ(r.key_prefix, "app:");
  EXPECT_EQ(r.command_timeout, 20ms);
  EXPECT_EQ(r.connect_timeout, 300ms);
  EXPECT_EQ(r.on_error, failure_policy::deny);
  EXPECT_EQ(r.max_pending, 77u);
  EXPECT_EQ(r.breaker_failure_threshold, 9);
  EXPECT_EQ(r.breaker_probe_interval, 750ms);
  EXPECT_EQ(r.error_log_interval, 0ms);
  EXPECT_EQ(r.cluster_refresh_interval, 2500ms);
  EXPECT_EQ(r.max_batch, 16u);
  EXPECT_TRUE(r.tls);
  EXPECT_EQ(r.tls_ca_file, "/etc/ssl/redis-ca.pem");
  EXPECT_EQ(r.tls_ca_dir, "/etc/ssl/redis-cas");
  EXPECT_EQ(r.tls_cert_file, "/etc/sluice/client.pem");
  EXPECT_EQ(r.tls_key_file, "/etc/sluice/client.key");
  EXPECT_EQ(r.tls_server_name, "redis.internal");
  EXPECT_FALSE(r.tls_verify);
  EXPECT_EQ(r.wait_replicas, 1);
  EXPECT_EQ(r.clock_for_test, nullptr);
  EXPECT_EQ(c->backend.max_keys_per_rule, 5000u);

  auto defaults = parse_config(std::string(seed) + "[backend]\ntype = \"redis\"\n", "d.toml");
  ASSERT_TRUE(defaults.ok()) << defaults.error().message;
  EXPECT_EQ(defaults->backend.redis, redis_options{});
  EXPECT_EQ(defaults->backend, backend_settings{.type = backend_type::redis});

  auto cluster = parse_config(std::string(seed) + "[backend]\ntype = \"redis_cluster\"\ndatabase = 1\n", "c.toml");
  ASSERT_FALSE(cluster.ok());
  EXPECT_NE(cluster.error().message.find("database must be 0 for a Redis Cluster"), std::string::npos)
      << cluster.error().message;
}

// A bad value of any [backend] key is an error naming the key and where it is.
TEST(Config, BadValueOfEachBackendKey) {
  const std::string b = "[backend]\n";
  struct bad_case {
    const char* line;
    const char* message;  // the start of the error, after "t.toml:2:"
  };
  const bad_case cases[] = {
      {"type = 1", "8: type must be a string, got an integer"},
      {"addresses = []", "13: addresses must not be empty"},
      {"addresses = [\"nohost\"]", "14: each address must be a \"host:port\" string"},
      {"addresses = [\"h:0\"]", "14: each address must be a \"host:port\" string (port 1-65535)"},
      {"addresses = [\"unix:\"]", "14: each address must be"},
      {"username = 7", "12: username must be a string, got an integer"},
      {"password = true", "12: password must be a string, got a boolean"},
      {"database = -1", "12: database must be between 0 and 1000000, got -1"},
      {"database = \"0\"", "12: database must be an integer, got a string"},
      {"key_prefix = \"a{b}:\"", "14: key_prefix must not contain '{' or '}'"},
      {"key_prefix = 5", "14: key_prefix must be a string, got an integer"},
      {"timeout_ms = 60001", "14: timeout_ms must be between 1 and 60000, got 60001"},
      {"connect_timeout_ms = 0", "22: connect_timeout_ms must be between 1 and 60000, got 0"},
      {"connect_timeout_ms = 1.5", "22: connect_timeout_ms must be an integer, got a float"},
      {"on_error = \"local \"", "12: on_error must be allow, deny or local, got \"local \""},
      {"max_pending = 0", "15: max_pending must be between 1 and 10000000, got 0"},
      {"breaker_failure_threshold = 0", "29: breaker_failure_threshold must be between 1 and 1000000, got 0"},
      {"breaker_failure_threshold = \"5\"", "29: breaker_failure_threshold must be an integer, got a string"},
      {"breaker_probe_interval_ms = 0", "29: breaker_probe_interval_ms must be between 1 and 86400000, got 0"},
      {"breaker_probe_interval_ms = 86400001", "29: breaker_probe_interval_ms must be between 1 and 86400000"},
      {"error_log_interval_ms = -1", "25: error_log_interval_ms must be between 0 and 86400000, got -1"},
      {"error_log_interval_ms = [1]", "25: error_log_interval_ms must be an integer, got an array"},
      {"max_keys_per_rule = 0", "21: max_keys_per_rule must be between 1 and 1000000000, got 0"},
      {"max_batch = 0", "13: max_batch must be between 1 and 1000, got 0"},
      {"cluster_refresh_interval_ms = 0", "31: cluster_refresh_interval_ms must be between 1 and 86400000, got 0"},
      {"tls = \"yes\"", "7: tls must be a boolean, got a string"},
      {"tls_ca_file = \"/ca.pem\"", "15: tls_ca_file needs tls = true"},
      {"tls_verify = false", "14: tls_verify needs tls = true"},
      {"wait_replicas = 65", "17: wait_replicas must be between 0 and 64, got 65"},
      {"sentinels = [\"10.0.0.1:26379\"]", "13: sentinels needs type = \"redis_sentinel\""},
      {"master_name = \"m\"", "15: master_name needs type = \"redis_sentinel\""},
      {"breaker_threshold = 5", "1: unknown key 'breaker_threshold' in [backend]"},
  };
  for (const bad_case& c : cases) {
    SCOPED_TRACE(c.line);
    expect_error(b + c.line + "\n", std::string("t.toml:2:") + c.message);
  }
}

// type = "redis_sentinel": the sentinels become the backend's addresses; the master's name and the
// sentinels' AUTH are read; what does not belong to Sentinel is named.
TEST(Config, RedisSentinelBackend) {
  auto c = parse_config(std::string(seed) + R"([backend]
type = "redis_sentinel"
sentinels = ["10.0.0.1:26379", "10.0.0.2:26379"]
master_name = "rl-master"
sentinel_username = "watcher"
sentinel_password = "s"
password = "m"
)",
                        "s.toml");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->backend.type, backend_type::redis_sentinel);
  const redis_options& r = c->backend.redis;
  EXPECT_EQ(r.addresses, (std::vector<std::string>{"10.0.0.1:26379", "10.0.0.2:26379"}));
  EXPECT_EQ(r.master_name, "rl-master");
  EXPECT_EQ(r.sentinel_username, "watcher");
  EXPECT_EQ(r.sentinel_password, "s");
  EXPECT_EQ(r.password, "m");

  const std::string head = "[backend]\ntype = \"redis_sentinel\"\n";
  const std::string sentinels = "sentinels = [\"10.0.0.1:26379\"]\n";
  expect_error(head + "master_name = \"m\"\n", "t.toml:1:1: [backend] is missing 'sentinels'");
  expect_error(head + sentinels, "t.toml:1:1: [backend] is missing 'master_name'");
  expect_error(head + sentinels + "master_name = \"a b\"\n", "t.toml:4:15: master_name must be 1 to 256 bytes");
  expect_error(head + sentinels + "master_name = \"m\"\naddresses = [\"h:1\"]\n",
               "t.toml:5:13: addresses is not read with type = \"redis_sentinel\": set sentinels");
  expect_error(head + sentinels + "master_name = \"m\"\nsentinel_username = \"w\"\n",
               "t.toml:5:21: sentinel_username needs a sentinel_password");
  expect_error(head + "sentinels = [\"nohost\"]\nmaster_name = \"m\"\n", "t.toml:3:14: each sentinel must be");
}

TEST(Config, LoadConfigNamesMissingFile) {
  auto c = load_config("/nonexistent/sluice.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().message, "/nonexistent/sluice.toml: cannot open the file (No such file or directory)");
}

// [log]: its two keys read, anything else refused with the key named.
TEST(Config, LogSection) {
  const std::string rule = "[ratelimit]\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = 1\n";
  auto c = parse_config(rule + "[log]\nformat = \"json\"\nlevel = \"warn\"\n", "t.toml");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->log, (log_settings{.format = "json", .level = "warn"}));
  auto defaults = parse_config(rule, "t.toml");
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->log, log_settings{});
  const std::pair<const char*, const char*> bad[] = {
      {"[log]\nformat = \"xml\"\n", "t.toml:2:10: format must be \"text\" or \"json\", got \"xml\""},
      {"[log]\nlevel = \"loud\"\n", "level must be trace, debug, info, warn, error, critical or off, got \"loud\""},
      {"[log]\nlevel = 3\n", "level must be a string"},
      {"[log]\ncolour = true\n", "unknown key 'colour' in [log]"},
  };
  for (const auto& [text, message] : bad) {
    auto e = parse_config(text, "t.toml");
    ASSERT_FALSE(e.ok()) << text;
    EXPECT_NE(e.error().message.find(message), std::string::npos) << e.error().message;
  }
}

// [envoy] and grpc_listen: every option read, the directory relative to the file, errors named.
TEST(Config, EnvoySection) {
  auto c = parse_config(R"([server]
grpc_listen = "127.0.0.1:8081"
[envoy]
config_dir = "envoy"
all_or_nothing = false
shadow_mode = true
quota_mode = true
near_limit_ratio = 0.9
merge_domains = true
response_headers = true
header_reset = "X-Reset"
max_detailed_labels = 7
)",
                        "/etc/sluice/sluice.toml");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_TRUE(c->rules.empty()) << "an Envoy-only config needs no [[rules]]";
  EXPECT_EQ(c->server.grpc_listen, "127.0.0.1:8081");
  EXPECT_TRUE(c->envoy.enabled);
  EXPECT_EQ(c->envoy.config_dir, "/etc/sluice/envoy");
  EXPECT_FALSE(c->envoy.options.all_or_nothing);
  EXPECT_TRUE(c->envoy.options.shadow_mode);
  EXPECT_TRUE(c->envoy.options.quota_mode);
  EXPECT_DOUBLE_EQ(c->envoy.options.near_limit_ratio, 0.9);
  EXPECT_TRUE(c->envoy.merge_domains);
  EXPECT_TRUE(c->envoy.options.response_headers);
  EXPECT_EQ(c->envoy.options.header_reset, "X-Reset");
  EXPECT_EQ(c->envoy.options.header_limit, "RateLimit-Limit");
  EXPECT_EQ(c->envoy.options.max_detailed_labels, 7u);

  const std::pair<const char*, const char*> bad[] = {
      {"[server]\ngrpc_listen = \"nowhere\"\n[ratelimit]\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = 1\n",
       "grpc_listen must be \"host:port\""},
      {"[envoy]\nconfig_dir = \"envoy\"\n", "[envoy] is served on [server] grpc_listen, which is not set"},
      {"[server]\ngrpc_listen = \"127.0.0.1:1\"\n[envoy]\n", "[envoy] is missing 'config_dir'"},
      {"[server]\ngrpc_listen = \"127.0.0.1:1\"\n[envoy]\nconfig_dir = \"e\"\nheader_limit = \"a b\"\n",
       "header_limit must be a header name"},
      {"[server]\ngrpc_listen = \"127.0.0.1:1\"\n[envoy]\nconfig_dir = \"e\"\nmystery = 1\n", "unknown key 'mystery'"},
      {"[server]\ngrpc_listen = \"127.0.0.1:1\"\n[envoy]\nconfig_dir = \"e\"\nnear_limit_ratio = 1.5\n",
       "near_limit_ratio must be a number > 0 and <= 1"},
      {"[server]\ngrpc_listen = \"127.0.0.1:1\"\n[envoy]\nconfig_dir = \"e\"\nquota_mode = \"yes\"\n",
       "quota_mode must be a boolean"},
  };
  for (const auto& [text, message] : bad) {
    auto e = parse_config(text, "t.toml");
    ASSERT_FALSE(e.ok()) << text;
    EXPECT_NE(e.error().message.find(message), std::string::npos) << e.error().message;
  }
}

}  // namespace
}  // namespace sluice::server

namespace sluice::server {
namespace {

// Found by fuzz/fuzz_config: toml++ 3.3 asserted on a table header that does not start a key.
TEST(Config, TableHeaderWithoutKeyStartIsAnError) {
  for (const char* text : {"[!a]\n", "[!\n", "[[!a]]\n", "[ !a]\n", "[[[1]]]\n", "[[=\n"}) {
    auto c = parse_config(text, "t.toml");
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_EQ(c.error().message.rfind("t.toml:1:", 0), 0u) << c.error().message;
  }
}

}  // namespace
}  // namespace sluice::server

namespace sluice::server {
namespace {

// Found by fuzz/fuzz_config: toml++ 3.3 reached __builtin_unreachable classifying some non-ASCII
// characters between tokens (U+0271 here); they are now plain parse errors.
TEST(Config, NonAsciiBetweenTokensIsAnError) {
  for (const char* text : {"\xc9\xb1", "[ratelimit]\nenabled = true\xc9\xb1\n", "x = 1 \xc3\xa9\n", "[a\xc9\xb1]\n"}) {
    auto c = parse_config(text, "t.toml");
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_EQ(c.error().message.rfind("t.toml:", 0), 0u) << c.error().message;
  }
  // Inside strings (also after a line-ending backslash) and comments any character is fine.
  auto ok = parse_config(
      "# r\xc3\xa8gle\n[[rules]]\nname = \"api\" # \xc9\xb1\nalgorithm = 'token_bucket'\nrate = 1\nburst = 2\n"
      "[backend]\nkey_prefix = \"\"\"a\\\n  \xc9\xb1\"\"\"\n",
      "t.toml");
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(ok->backend.redis.key_prefix, "a\xc9\xb1");
}

}  // namespace
}  // namespace sluice::server

#include "server/backend_factory.hpp"

namespace sluice::server {
namespace {

// A Redis backend cannot compute rates above 10^6 per second exactly: such a config is refused at
// load (and reload), naming the rule, rather than failing every check later.
TEST(Config, RedisBackendRefusesRulesItCannotServe) {
  const std::string redis = "[backend]\ntype = \"redis\"\n";
  const std::string fast = "[[rules]]\nname = \"fast\"\nalgorithm = \"token_bucket\"\nrate = 2000000\nburst = 10\n";
  auto c = parse_config(redis + fast, "t.toml");
  ASSERT_TRUE(c.ok()) << c.error().message;
  auto servable = server::check_servable(*c);
#ifdef SLUICE_TEST_WITH_REDIS
  ASSERT_FALSE(servable.ok());
  EXPECT_EQ(servable.error(), errc::config_invalid);
  EXPECT_NE(servable.error().message.find("rule 'fast'"), std::string::npos) << servable.error().message;
#endif
  auto memory = parse_config(fast, "t.toml");
  ASSERT_TRUE(memory.ok());
  EXPECT_TRUE(server::check_servable(*memory).ok());  // the in-process bucket goes up to 10^9/s
}

TEST(Config, EtcdSection) {
  const std::string rule = "[[rules]]\nname = \"api\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = 1\n";
  auto none = parse_config(rule, "t.toml");
  ASSERT_TRUE(none.ok()) << none.error().message;
  EXPECT_FALSE(none->etcd.enabled);
  auto c = parse_config(rule +
                            "[etcd]\nendpoints = [\"127.0.0.1:2379\", \"[::1]:2379\"]\nprefix = \"/limits/\"\n"
                            "username = \"u\"\npassword = \"p\"\nca_file = \"ca.pem\"\ndial_timeout_ms = 500\n",
                        "t.toml");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_TRUE(c->etcd.enabled);
  EXPECT_EQ(c->etcd.options.endpoints, (std::vector<std::string>{"127.0.0.1:2379", "[::1]:2379"}));
  EXPECT_EQ(c->etcd.options.prefix, "/limits/");
  EXPECT_EQ(c->etcd.options.username, "u");
  EXPECT_EQ(c->etcd.options.ca_file, "ca.pem");
  EXPECT_EQ(c->etcd.options.dial_timeout, std::chrono::milliseconds(500));
  for (const auto& [bad, what] : std::vector<std::pair<std::string, std::string>>{
           {"[etcd]\nprefix = \"/x/\"\n", "missing 'endpoints'"},
           {"[etcd]\nendpoints = []\n", "must not be empty"},
           {"[etcd]\nendpoints = [\"nohost\"]\n", "host:port"},
           {"[etcd]\nendpoints = [\"a:1\"]\nusername = \"u\"\n", "needs a password"},
           {"[etcd]\nendpoints = [\"a:1\"]\ncert_file = \"c.pem\"\n", "key_file"},
           {"[etcd]\nendpoints = [\"a:1\"]\ndial_timeout_ms = 0\n", "dial_timeout_ms"},
           {"[etcd]\nendpoints = [\"a:1\"]\nsurprise = 1\n", "unknown key 'surprise'"}}) {
    auto r = parse_config(rule + bad, "t.toml");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.error().message.find(what), std::string::npos) << r.error().message;
  }
}

// An etcd value holds the fields of a [[rules]] table, with the same validation and messages.
TEST(Config, RuleFromJson) {
  auto r = parse_rule_json("tenant_api",
                           R"({"algorithm":"sliding_window","window":"60s","tenant_limit":1000,"user_limit":100})",
                           "etcd /sluice/rules/tenant_api");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->name, "tenant_api");
  EXPECT_TRUE(r->is_dual_layer());
  ASSERT_TRUE(r->tenant.has_value());
  EXPECT_EQ(r->tenant->limit, 1000);
  EXPECT_EQ(r->limit.limit, 100);
  auto tb = parse_rule_json("api", R"({"algorithm":"token_bucket","rate":2.5,"burst":10})", "e");
  ASSERT_TRUE(tb.ok()) << tb.error().message;
  EXPECT_EQ(tb->limit.burst, 10);
  auto bad = parse_rule_json("api", R"({"algorithm":"token_bucket","rate":5})", "etcd /sluice/rules/api");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error(), errc::config_invalid);
  EXPECT_EQ(bad.error().message.rfind("etcd /sluice/rules/api: ", 0), 0u) << bad.error().message;
  EXPECT_NE(bad.error().message.find("burst"), std::string::npos) << bad.error().message;
}

// [[overrides]]: one key's, tenant's or tenant's user's own limits, checked against the rule.
TEST(Config, Overrides) {
  const std::string rules =
      "[[rules]]\nname = \"api\"\nalgorithm = \"token_bucket\"\nrate = 5\nburst = 10\n"
      "[[rules]]\nname = \"tenant_api\"\nalgorithm = \"sliding_window\"\nwindow = \"60s\"\ntenant_limit = "
      "100\nuser_limit = 10\n"
      "[[rules]]\nname = \"quota\"\nalgorithm = \"fixed_window\"\nwindow = \"1h\"\nlimit = 3\n";
  auto c = parse_config(rules +
                            "[[overrides]]\nrule = \"api\"\nkey = \"user:42\"\nrate = 50\nburst = 100\n"
                            "[[overrides]]\nrule = \"tenant_api\"\ntenant = \"acme\"\ntenant_limit = 1000\n"
                            "[[overrides]]\nrule = \"tenant_api\"\ntenant = \"acme\"\nuser = \"bob\"\nuser_limit = 50\n"
                            "[[overrides]]\nrule = \"quota\"\nkey = \"k\"\nlimit = 30\n",
                        "t.toml");
  ASSERT_TRUE(c.ok()) << c.error().message;
  ASSERT_EQ(c->overrides.size(), 4u);
  auto named = [&](std::string_view name) -> const rule& {
    return *std::find_if(c->rules.begin(), c->rules.end(), [&](const rule& r) { return r.name == name; });
  };
  auto api = apply_override(named("api"), c->overrides[0]);
  ASSERT_TRUE(api.ok()) << api.error().message;
  EXPECT_EQ(api->limit.burst, 100);
  EXPECT_DOUBLE_EQ(api->limit.rate.per_second, 50);
  auto acme = apply_override(named("tenant_api"), c->overrides[1]);
  ASSERT_TRUE(acme.ok());
  EXPECT_EQ(acme->tenant->limit, 1000);
  EXPECT_EQ(acme->limit.limit, 10) << "the user layer is not overridden";
  auto bob = apply_override(named("tenant_api"), c->overrides[2]);
  ASSERT_TRUE(bob.ok());
  EXPECT_EQ(bob->tenant->limit, 100);
  EXPECT_EQ(bob->limit.limit, 50);
  for (const auto& [bad, what] : std::vector<std::pair<std::string, std::string>>{
           {"[[overrides]]\nrule = \"nope\"\nkey = \"k\"\nlimit = 1\n", "names no rule"},
           {"[[overrides]]\nrule = \"api\"\nkey = \"k\"\nlimit = 1\n", "limit does not apply"},
           {"[[overrides]]\nrule = \"api\"\ntenant = \"t\"\nrate = 1\n", "single-layer"},
           {"[[overrides]]\nrule = \"tenant_api\"\nkey = \"k\"\nuser_limit = 1\n", "dual-layer"},
           {"[[overrides]]\nrule = \"tenant_api\"\ntenant = \"t\"\nuser = \"u\"\ntenant_limit = 1\n",
            "tenant_limit does not apply"},
           {"[[overrides]]\nrule = \"quota\"\nkey = \"k\"\n", "missing 'a limit'"},
           {"[[overrides]]\nrule = \"quota\"\nkey = \"k\"\nlimit = 0\n", "limit must be between"},
           {"[[overrides]]\nrule = \"quota\"\nkey = \"\"\nlimit = 2\n", "key must not be empty"},
           {"[[overrides]]\nrule = \"quota\"\nkey = \"k\"\nlimit = 2\n[[overrides]]\nrule = \"quota\"\nkey = "
            "\"k\"\nlimit = 3\n",
            "a second override of the same key"},
           {"[[overrides]]\nrule = \"quota\"\nuser = \"u\"\nlimit = 2\n", "user needs tenant"}}) {
    auto r = parse_config(rules + bad, "t.toml");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.error().message.find(what), std::string::npos) << r.error().message;
  }
  auto json =
      parse_override_json(R"({"rule":"api","key":"user:42","rate":50,"burst":100})", "etcd /sluice/overrides/x");
  ASSERT_TRUE(json.ok()) << json.error().message;
  EXPECT_EQ(json->target(), c->overrides[0].target());
  EXPECT_FALSE(parse_override_json(R"({"rule":"api","key":"k","burst":[1]})", "e").ok());
}

}  // namespace
}  // namespace sluice::server
