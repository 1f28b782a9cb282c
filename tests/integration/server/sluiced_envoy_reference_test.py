#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""envoyproxy/ratelimit's own test scenarios, replayed against a running sluiced over gRPC.

Each scenario below comes from one of the reference's tests (named in `source`): its config, the
requests, and the answers the reference gives — codes, current limits, remaining units, resets,
and the per-descriptor counters it keeps. The reference's unit tests run on mocks; here each is a
real sequence of calls whose counters reach the states those mocks stand for. The configs are
written anew for this suite, with the shapes the reference's use.

sluiced runs in the reference's counting mode (`all_or_nothing = false`: every descriptor counted
on its own). A scenario where sluice answers differently on purpose says so in `differs`, and its
expectations are sluice's; README.md lists them. Every scenario runs on the memory backend and on a
real redis-server, each on a fresh sluiced (and, on Redis, an empty database).

Windows are aligned to the epoch, as the reference's: a scenario that must stay in one window
waits for a fresh one when too little of the current one is left (it never sleeps to move a
limiter).

Usage: SLUICED=/path/to/sluiced PROTO_DIR=src/envoy/proto /usr/bin/python3 sluiced_envoy_reference_test.py
"""

import os
import re
import sys
import tempfile
import time
import unittest

sys.dont_write_bytecode = True  # keep the source tree clean
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sluiced_harness import RedisServer, Sluiced, wait_for  # noqa: E402
from sluiced_grpc_interop_test import compile_protos, should_rate_limit  # noqa: E402

import grpc  # noqa: E402  (python3-grpcio)

UNITS = {"SECOND": 1, "MINUTE": 60, "HOUR": 3600, "DAY": 86400}
UNIT_NUMBERS = {"SECOND": 1, "MINUTE": 2, "HOUR": 3, "DAY": 4, "MONTH": 5, "YEAR": 6, "WEEK": 7}  # the protocol's
UNIT_NAMES = {n: name for name, n in UNIT_NUMBERS.items()}
CODE_NAMES = {0: "UNKNOWN", 1: "OK", 2: "OVER_LIMIT"}


class Scenario:
    def __init__(self, name, source, yaml, steps, envoy="", window="MINUTE", seconds=5, differs=None):
        self.name = name
        self.source = source  # the reference's test it comes from
        self.yaml = yaml
        self.steps = steps  # ask(...) and stats(...) tuples, in order
        self.envoy = envoy  # more [envoy] settings
        self.window = window  # the shortest unit it counts in: all its steps fall in one such window
        self.seconds = seconds  # how long its steps may take
        self.differs = differs  # why sluice answers differently, when it does


def ask(request, expect, hits=0, domain=None):
    """One call: `request` is descriptors separated by ';', each "[k=v,...]" with optional
    "(h=N)" (its hits_addend) and "{N/UNIT}" (its own limit); `expect` is "CODE: status ; ..."
    where a status is "OK|OVER rpu/UNIT ['name'] rem=N", "OK -" (no limit) or "UNL" (unlimited)."""
    return ("ask", domain, request, hits, expect)


def stats(descriptor, **counts):
    """sluiced's counters of one descriptor (its stats path), as the reference names them."""
    return ("stats", descriptor, counts)


def many(n, make):
    return [make(i) for i in range(n)]


# --- integration_test.go -------------------------------------------------------------------------
ANOTHER_YAML = """domain: another
descriptors:
  - key: per_minute
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: per_hour
    rate_limit: {unit: hour, requests_per_unit: 10}
"""

SCENARIOS = [
    Scenario("unknown_domain", "integration_test.go testBasicBaseConfig (unknown domain)", ANOTHER_YAML,
             [ask("[hello=world]", "OK: OK -", domain="nowhere")]),
    Scenario("one_key_to_its_limit_and_past", "integration_test.go testBasicBaseConfig (one key)", ANOTHER_YAML,
             many(20, lambda i: ask("[per_minute=r1]", "OK: OK 20/MINUTE rem=%d" % (19 - i)))
             + many(5, lambda i: ask("[per_minute=r1]", "OVER_LIMIT: OVER 20/MINUTE rem=0"))
             + [stats("per_minute", hits=25, over_limit=5, within_limit=20, near_limit=4)]),
    Scenario("two_descriptors_each_counted", "integration_test.go testBasicBaseConfig (two descriptors)",
             ANOTHER_YAML,
             many(10, lambda i: ask("[per_minute=r2] ; [per_hour=r2]",
                                    "OK: OK 20/MINUTE rem=%d ; OK 10/HOUR rem=%d" % (19 - i, 9 - i)))
             # The first descriptor keeps counting while the second refuses the request.
             + many(5, lambda i: ask("[per_minute=r2] ; [per_hour=r2]",
                                     "OVER_LIMIT: OK 20/MINUTE rem=%d ; OVER 10/HOUR rem=0" % (9 - i)))
             + [stats("per_minute", hits=15, within_limit=15), stats("per_hour", hits=15, over_limit=5)]),
]

# --- ratelimit_test.go (the service) -------------------------------------------------------------
FOO_YAML = """domain: svc
descriptors:
  - key: foo
    rate_limit: {name: key_name, unit: minute, requests_per_unit: 10}
"""
SHADOW_YAML = """domain: svc
descriptors:
  - key: foo
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: hello
    %s
    rate_limit: {unit: minute, requests_per_unit: 10}
"""
QUOTA_YAML = """domain: svc
descriptors:
  - key: regular
    value: limit
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: quota
    value: limit
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: quota2
    value: limit
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 5}
"""

SCENARIOS += [
    Scenario("a_name_is_echoed_and_a_descriptor_without_limit_is_ok", "ratelimit_test.go TestService", FOO_YAML,
             [ask("[foo=bar]", "OK: OK 10/MINUTE 'key_name' rem=1", hits=9),
              ask("[foo=bar] ; [hello=world]", "OK: OK 10/MINUTE 'key_name' rem=0 ; OK -"),
              ask("[foo=bar] ; [hello=world]", "OVER_LIMIT: OVER 10/MINUTE 'key_name' rem=0 ; OK -")]),
    Scenario("global_shadow_mode_answers_ok", "ratelimit_test.go TestServiceGlobalShadowMode", FOO_YAML,
             [ask("[foo=bar]", "OK: OK 10/MINUTE 'key_name' rem=0", hits=10),
              ask("[foo=bar] ; [hello=world]", "OK: OVER 10/MINUTE 'key_name' rem=0 ; OK -"),
              stats("foo", over_limit=1, shadow_mode=0)],
             envoy="shadow_mode = true\n"),
    Scenario("rule_shadow_mode", "ratelimit_test.go TestRuleShadowMode", SHADOW_YAML % "shadow_mode: true",
             [ask("[foo=bar] ; [hello=world]", "OK: OK 10/MINUTE rem=0 ; OK 10/MINUTE rem=0", hits=10),
              ask("[foo=bar] ; [hello=world]", "OK: OK 10/MINUTE rem=0 ; OK 10/MINUTE rem=0"),
              stats("foo", hits=11, over_limit=1, shadow_mode=1), stats("hello", over_limit=1, shadow_mode=1)]),
    Scenario("mixed_rule_shadow_mode", "ratelimit_test.go TestMixedRuleShadowMode", SHADOW_YAML % "",
             [ask("[foo=bar] ; [hello=world]", "OK: OK 10/MINUTE rem=0 ; OK 10/MINUTE rem=0", hits=10),
              ask("[foo=bar] ; [hello=world]", "OVER_LIMIT: OK 10/MINUTE rem=0 ; OVER 10/MINUTE rem=0")]),
    Scenario("unlimited", "ratelimit_test.go TestUnlimited", """domain: svc
descriptors:
  - key: foo
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: baz
    rate_limit: {unlimited: true}
""", [ask("[foo=bar] ; [hello=world] ; [baz=qux]", "OK: OK 10/MINUTE rem=9 ; OK - ; UNL"),
      stats("baz", hits=0)]),
    Scenario("global_quota_mode", "ratelimit_test.go TestServiceGlobalQuotaMode", """domain: svc
descriptors:
  - key: foo
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: hello
    rate_limit: {unit: minute, requests_per_unit: 5}
""", [ask("[foo=bar]", "OK: OK 10/MINUTE rem=0", hits=10),
      ask("[foo=bar] ; [hello=world]", "OK: OVER 10/MINUTE rem=0 ; OK 5/MINUTE rem=4"),
      ask("[hello=world]", "OK: OK 5/MINUTE rem=0", hits=4),
      ask("[foo=bar] ; [hello=world]", "OVER_LIMIT: OVER 10/MINUTE rem=0 ; OVER 5/MINUTE rem=0")],
             envoy="quota_mode = true\n"),
    Scenario("per_descriptor_quota_mode", "ratelimit_test.go TestServicePerDescriptorQuotaMode and the mixed-mode"
             " tests", QUOTA_YAML,
             [ask("[regular=limit] ; [quota=limit]", "OK: OK 5/MINUTE rem=4 ; OK 3/MINUTE rem=2"),
              ask("[quota=limit]", "OK: OK 3/MINUTE rem=0", hits=2),
              # quota over, the only quota descriptor: the request is refused.
              ask("[regular=limit] ; [quota=limit]", "OVER_LIMIT: OK 5/MINUTE rem=3 ; OVER 3/MINUTE rem=0"),
              # one quota descriptor of two over: answered OK.
              ask("[quota=limit] ; [quota2=limit]", "OK: OVER 3/MINUTE rem=0 ; OK 5/MINUTE rem=4"),
              ask("[quota2=limit]", "OK: OK 5/MINUTE rem=0", hits=4),
              ask("[quota=limit] ; [quota2=limit]", "OVER_LIMIT: OVER 3/MINUTE rem=0 ; OVER 5/MINUTE rem=0"),
              # a regular descriptor over refuses whatever the quotas say.
              ask("[regular=limit]", "OK: OK 5/MINUTE rem=0", hits=3),
              ask("[regular=limit] ; [quota2=limit](h=0)", "OVER_LIMIT: OVER 5/MINUTE rem=0 ; OVER 5/MINUTE rem=0")]),
    Scenario("quota_and_global_shadow_mode", "ratelimit_test.go TestServiceQuotaModeWithShadowMode", QUOTA_YAML,
             [ask("[quota=limit] ; [quota2=limit]", "OK: OK 3/MINUTE rem=0 ; OK 5/MINUTE rem=2", hits=3),
              ask("[quota2=limit]", "OK: OK 5/MINUTE rem=0", hits=2),
              ask("[quota=limit] ; [quota2=limit]", "OK: OVER 3/MINUTE rem=0 ; OVER 5/MINUTE rem=0")],
             envoy="shadow_mode = true\n"),
]

# --- fixed_cache_impl_test.go (the Redis cache) --------------------------------------------------
SCENARIOS += [
    Scenario("a_look_at_a_descriptor_without_limit", "fixed_cache_impl_test.go TestRedis (hits_addend 0, no limit)",
             """domain: cache
descriptors:
  - key: key2
    value: value2
    descriptors:
      - key: subkey2
        value: subvalue2
        rate_limit: {unit: minute, requests_per_unit: 10}
""", [ask("[key2=value2,subkey2=subvalue2]", "OK: OK 10/MINUTE rem=0", hits=10),
      ask("[key2=value2](h=0) ; [key2=value2,subkey2=subvalue2](h=1)", "OVER_LIMIT: OK - ; OVER 10/MINUTE rem=0"),
      stats("key2_value2.subkey2_subvalue2", hits=11, over_limit=1, near_limit=2, within_limit=10)]),
    Scenario("a_look_at_a_spent_counter_is_over", "fixed_cache_impl_test.go TestRedis (hits_addend 0, over)", """domain: cache
descriptors:
  - key: key3
    value: value3
    rate_limit: {unit: hour, requests_per_unit: 10}
    descriptors:
      - key: subkey3
        value: subvalue3
        rate_limit: {unit: day, requests_per_unit: 10}
""", [ask("[key3=value3] ; [key3=value3,subkey3=subvalue3]", "OK: OK 10/HOUR rem=0 ; OK 10/DAY rem=0", hits=10),
      ask("[key3=value3](h=0) ; [key3=value3,subkey3=subvalue3](h=1)",
          "OVER_LIMIT: OVER 10/HOUR rem=0 ; OVER 10/DAY rem=0"),
      stats("key3_value3", hits=10, over_limit=0), stats("key3_value3.subkey3_subvalue3", hits=11, over_limit=1)],
             window="HOUR"),
    Scenario("near_limit_counts_the_units_past_the_ratio", "fixed_cache_impl_test.go TestNearLimit (one hit)",
             """domain: cache
descriptors:
  - key: key4
    value: value4
    rate_limit: {unit: hour, requests_per_unit: 15}
""", many(15, lambda i: ask("[key4=value4]", "OK: OK 15/HOUR rem=%d" % (14 - i)))
             + [ask("[key4=value4]", "OVER_LIMIT: OVER 15/HOUR rem=0"),
                stats("key4_value4", hits=16, within_limit=15, near_limit=3, over_limit=1)], window="HOUR"),
    Scenario("near_limit_with_several_hits", "fixed_cache_impl_test.go TestNearLimit (hits_addend > 1)",
             """domain: cache
descriptors:
  - {key: key5, value: value5, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: key6, value: value6, rate_limit: {unit: minute, requests_per_unit: 8}}
  - {key: key7, value: value7, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: key8, value: value8, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: key9, value: value9, rate_limit: {unit: minute, requests_per_unit: 20}}
""", [ask("[key5=value5]", "OK: OK 20/MINUTE rem=18", hits=2), ask("[key5=value5]", "OK: OK 20/MINUTE rem=15", hits=3),
      stats("key5_value5", hits=5, within_limit=5, near_limit=0),
      ask("[key6=value6]", "OK: OK 8/MINUTE rem=3", hits=5), ask("[key6=value6]", "OK: OK 8/MINUTE rem=1", hits=2),
      stats("key6_value6", hits=7, within_limit=7, near_limit=1),
      ask("[key7=value7]", "OK: OK 20/MINUTE rem=4", hits=16), ask("[key7=value7]", "OK: OK 20/MINUTE rem=1", hits=3),
      stats("key7_value7", hits=19, within_limit=19, near_limit=3),
      ask("[key8=value8]", "OK: OK 20/MINUTE rem=1", hits=19), ask("[key8=value8]", "OVER_LIMIT: OVER 20/MINUTE rem=0", hits=3),
      stats("key8_value8", hits=22, within_limit=19, near_limit=4, over_limit=2),
      ask("[key9=value9]", "OK: OK 20/MINUTE rem=5", hits=15), ask("[key9=value9]", "OVER_LIMIT: OVER 20/MINUTE rem=0", hits=7),
      stats("key9_value9", hits=22, within_limit=15, near_limit=4, over_limit=2)]),
    Scenario("rule_shadow_mode_counts", "fixed_cache_impl_test.go TestOverLimitWithLocalCacheShadowRule (no local cache)",
             """domain: cache
descriptors:
  - key: key4
    value: value4
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 15}
""", [ask("[key4=value4]", "OK: OK 15/HOUR rem=0", hits=15), ask("[key4=value4]", "OK: OK 15/HOUR rem=0"),
      stats("key4_value4", hits=16, within_limit=15, over_limit=1, shadow_mode=1)], window="HOUR"),
]

# --- config_test.go (lookups) ---------------------------------------------------------------------
SCENARIOS += [
    Scenario("lookups_follow_the_tree", "config_test.go TestBasicConfig", """domain: tree
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: subkey1
        value: subvalue1
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key2
    value: value2
    rate_limit: {unit: minute, requests_per_unit: 30}
  - key: key2
    value: value3
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: key4
    rate_limit: {name: key4_rate_limit, unit: day, requests_per_unit: 1}
  - key: key6
    rate_limit: {unlimited: true}
""", [ask("[key1=something]", "OK: OK -"), ask("[key1=value1]", "OK: OK -"),
      ask("[key2=value2,subkey=subvalue]", "OK: OK -"), ask("[key5=value5,subkey5=subvalue]", "OK: OK -"),
      ask("[key1=value1,subkey1=something]", "OK: OK 5/SECOND rem=4"),
      ask("[key1=value1,subkey1=subvalue1]", "OK: OK 10/SECOND rem=9"),
      ask("[key2=something]", "OK: OK 20/MINUTE rem=19"), ask("[key2=value2]", "OK: OK 30/MINUTE rem=29"),
      ask("[key2=value3]", "OK: OK -"), ask("[key3=foo]", "OK: OK 1/HOUR rem=0"),
      ask("[key4=foo]", "OK: OK 1/DAY 'key4_rate_limit' rem=0"), ask("[key6=foo]", "OK: UNL")]),
    Scenario("wildcards", "config_test.go TestWildcardConfig", """domain: wild
descriptors:
  - {key: wild, value: "foo*", rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: noWild, value: foo, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: noVal, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: midWild, value: "bar*b", rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: multiWild, value: "foo*bar*baz", rate_limit: {unit: minute, requests_per_unit: 10}}
  - key: nestedWild
    value: val1
    descriptors:
      - {key: wild, value: "goo*", rate_limit: {unit: minute, requests_per_unit: 20}}
""", [ask("[wild=foo1]", "OK: OK 20/MINUTE rem=19"), ask("[wild=foo2]", "OK: OK 20/MINUTE rem=19"),
      ask("[nestedWild=val1,wild=goo2]", "OK: OK 20/MINUTE rem=19"), ask("[wild=bar]", "OK: OK -"),
      ask("[noWild=foo1]", "OK: OK -"), ask("[midWild=barab]", "OK: OK 20/MINUTE rem=19"),
      ask("[midWild=barb]", "OK: OK 20/MINUTE rem=19"), ask("[midWild=bara]", "OK: OK -"),
      ask("[midWild=xbarb]", "OK: OK -"), ask("[multiWild=foo123bar456baz]", "OK: OK 10/MINUTE rem=9"),
      ask("[multiWild=foobarbaz]", "OK: OK 10/MINUTE rem=9"), ask("[multiWild=foo123baz]", "OK: OK -"),
      ask("[multiWild=bar456baz]", "OK: OK -"),
      stats("wild_foo*", hits=2), stats("midWild_bar*b", hits=2), stats("noVal", hits=0)]),
    Scenario("share_threshold", "config_test.go TestShareThreshold; integration_test.go testShareThreshold",
             """domain: share
descriptors:
  - {key: files, value: "files/*", share_threshold: true, rate_limit: {unit: hour, requests_per_unit: 10}}
  - {key: files_apart, value: "files/*", rate_limit: {unit: hour, requests_per_unit: 10}}
  - {key: file, value: test1, rate_limit: {unit: minute, requests_per_unit: 50}}
  - {key: file, value: "test*", share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 100}}
  - {key: midpath, value: "/api*v1", share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 100}}
""", many(10, lambda i: ask("[files=files/f%d.txt]" % i, "OK: OK 10/HOUR rem=%d" % (9 - i)))
             + [ask("[files=files/another.txt]", "OVER_LIMIT: OVER 10/HOUR rem=0"),
                ask("[files_apart=files/a]", "OK: OK 10/HOUR rem=9"), ask("[files_apart=files/b]", "OK: OK 10/HOUR rem=9"),
                ask("[file=test1]", "OK: OK 50/MINUTE rem=49"), ask("[file=test2]", "OK: OK 100/MINUTE rem=99"),
                ask("[file=test23]", "OK: OK 100/MINUTE rem=98"), ask("[midpath=/api/v1]", "OK: OK 100/MINUTE rem=99"),
                ask("[midpath=/apiXYZv1]", "OK: OK 100/MINUTE rem=98"), ask("[midpath=/api/v2]", "OK: OK -"),
                stats("files_files/*", hits=11, over_limit=1), stats("file_test*", hits=2)]),
    Scenario("a_requests_own_limit", "config_test.go TestConfigLimitOverride", """domain: tree
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
""", [ask("[key1=value1,subkey1=something]{10/DAY}", "OK: OK 10/DAY rem=9"),
      ask("[key1=value1,subkey1=something]{42/HOUR}", "OK: OK 42/HOUR rem=41"),
      ask("[key1=value1,subkey1=something_else]{42/HOUR}", "OK: OK 42/HOUR rem=41"),
      ask("[key1=value1,subkey1=something]{10/DAY}", "OK: OK -", domain="nowhere"),
      stats("key1_value1.subkey1_something", hits=2), stats("key1_value1.subkey1_something_else", hits=1)],
             window="HOUR"),
    Scenario("value_to_metric", "config_test.go value_to_metric tests", """domain: vtm
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 60}
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: "read*"
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: {unit: minute, requests_per_unit: 100}
""", [ask("[route=draw,http_method=GET,subject_id=123]", "OK: OK 60/MINUTE rem=59"),
      ask("[user=alice,action=readfile,resource=documents]", "OK: OK 100/MINUTE rem=99"),
      stats("route_draw.http_method_GET.subject_id", hits=1, within_limit=1),
      stats("user_alice.action_readfile.resource", hits=1)]),
]

# --- integration-test/scripts (Envoy in front, here its calls made directly) ----------------------
EXAMPLE_YAML = """domain: rl
descriptors:
  - key: category
    value: account
    rate_limit:
      replaces: [{name: bkthomps}, {name: fake_name}]
      unit: minute
      requests_per_unit: 4
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: bkthomps
        rate_limit: {replaces: [{name: bkthomps}], unit: minute, requests_per_unit: 2}
      - key: destination_cluster
        value: mock
        rate_limit: {unit: minute, requests_per_unit: 1}
      - key: destination_cluster
        value: override
        rate_limit: {replaces: [{name: banned_limit}], unit: minute, requests_per_unit: 2}
      - key: destination_cluster
        value: fake
        rate_limit: {name: fake_name, unit: minute, requests_per_unit: 2}
  - key: foo
    rate_limit: {unit: minute, requests_per_unit: 2}
    descriptors:
      - key: bar
        rate_limit: {unit: minute, requests_per_unit: 3}
      - key: bar
        value: bkthomps
        rate_limit: {name: bkthomps, unit: minute, requests_per_unit: 1}
      - key: bar
        value: banned
        rate_limit: {name: banned_limit, unit: minute, requests_per_unit: 0}
      - key: baz
        value: not-so-shady
        rate_limit: {unit: minute, requests_per_unit: 3}
      - key: baz
        value: shady
        rate_limit: {unit: minute, requests_per_unit: 3}
        shadow_mode: true
      - key: bay
        rate_limit: {unlimited: true}
  - key: unspec
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata: {service_with_quota: {name: service_1}}
  - key: service
    value: service_2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
    metadata: {service_with_quota: {name: service_2}}
"""
BANNED = "[foo=bkthomps,bar=banned]"
TWO = "[foo=my_foo,bar=bkthomps] ; [source_cluster=proxy,destination_cluster=%s]"
FIVE = "[foo=my_foo,bar=bkthomps] ; [source_cluster=proxy,destination_cluster=fake] ; [category=account]"
FAKE = "[foo=foo_3,bar=bar_3] ; [source_cluster=proxy,destination_cluster=fake]"

SCENARIOS += [
    Scenario("trigger_ratelimit", "integration-test/scripts/trigger-ratelimit.sh", EXAMPLE_YAML,
             many(3, lambda i: ask("[foo=pelle,baz=not-so-shady]", "OK: OK 3/MINUTE rem=%d" % (2 - i)))
             + many(2, lambda i: ask("[foo=pelle,baz=not-so-shady]", "OVER_LIMIT: OVER 3/MINUTE rem=0"))
             + [stats("foo.baz_not-so-shady", hits=5, within_limit=3, near_limit=1, over_limit=2)]),
    Scenario("trigger_shadow_mode_key", "integration-test/scripts/trigger-shadow-mode-key.sh", EXAMPLE_YAML,
             many(3, lambda i: ask("[foo=pelle,baz=shady]", "OK: OK 3/MINUTE rem=%d" % (2 - i)))
             + many(3, lambda i: ask("[foo=pelle,baz=shady]", "OK: OK 3/MINUTE rem=0"))
             + [stats("foo.baz_shady", hits=6, within_limit=3, near_limit=1, over_limit=3, shadow_mode=3)]),
    Scenario("value_in_the_stats_key_when_unspecified",
             "integration-test/scripts/value-included-in-stats-key-when-unspecified.sh", EXAMPLE_YAML,
             [ask("[unspec=unspecified_value]", "OK: OK 2/MINUTE rem=1"),
              ask("[unspec=unspecified_value]", "OK: OK 2/MINUTE rem=0"),
              ask("[unspec=unspecified_value]", "OVER_LIMIT: OVER 2/MINUTE rem=0"),
              stats("unspec_unspecified_value", hits=3, within_limit=2, near_limit=1, over_limit=1)]),
    Scenario("replaces", "integration-test/scripts/replaces.sh", EXAMPLE_YAML, [
        ask(BANNED, "OVER_LIMIT: OVER 0/MINUTE 'banned_limit' rem=0"),
        ask(BANNED + " ; [source_cluster=proxy,destination_cluster=mock]",
            "OVER_LIMIT: OVER 0/MINUTE 'banned_limit' rem=0 ; OK 1/MINUTE rem=0"),
        ask(BANNED + " ; [source_cluster=proxy,destination_cluster=override]", "OK: OK - ; OK 2/MINUTE rem=1"),
        ask(BANNED + " ; [source_cluster=proxy,destination_cluster=override]", "OK: OK - ; OK 2/MINUTE rem=0"),
        ask(BANNED + " ; [source_cluster=proxy,destination_cluster=override]", "OVER_LIMIT: OK - ; OVER 2/MINUTE rem=0"),
        ask(TWO % "bkthomps", "OK: OK - ; OK 2/MINUTE rem=1"),
        ask(TWO % "bkthomps", "OK: OK - ; OK 2/MINUTE rem=0"),
        ask(TWO % "bkthomps", "OVER_LIMIT: OK - ; OVER 2/MINUTE rem=0"),
        ask(TWO % "not_bkthomps", "OK: OK 1/MINUTE 'bkthomps' rem=0 ; OK -"),
        ask(TWO % "not_bkthomps", "OVER_LIMIT: OVER 1/MINUTE 'bkthomps' rem=0 ; OK -"),
        ask(TWO % "bkthomps", "OVER_LIMIT: OK - ; OVER 2/MINUTE rem=0"),
    ] + many(4, lambda i: ask(FIVE, "OK: OK - ; OK - ; OK 4/MINUTE rem=%d" % (3 - i))) + [
        ask(FIVE, "OVER_LIMIT: OK - ; OK - ; OVER 4/MINUTE rem=0"),
        ask("[foo=foo_2,bar=bkthomps]", "OK: OK 1/MINUTE 'bkthomps' rem=0"),
        ask("[foo=foo_2,bar=bkthomps]", "OVER_LIMIT: OVER 1/MINUTE 'bkthomps' rem=0"),
        ask(FAKE, "OK: OK 3/MINUTE rem=2 ; OK 2/MINUTE 'fake_name' rem=1"),
        ask(FAKE, "OK: OK 3/MINUTE rem=1 ; OK 2/MINUTE 'fake_name' rem=0"),
        ask(FAKE, "OVER_LIMIT: OK 3/MINUTE rem=0 ; OVER 2/MINUTE 'fake_name' rem=0"),
        ask(FIVE, "OVER_LIMIT: OK - ; OK - ; OVER 4/MINUTE rem=0"),
    ], differs="a limit of 0 requests answers without duration_until_reset, since no wait lifts it; the reference"
               " sends the time to its window's end"),
    Scenario("quota", "integration-test/scripts/quota.sh", EXAMPLE_YAML, [
        ask("[service=service_1] ; [service=service_2]", "OK: OK 1/MINUTE rem=0 ; OK 2/MINUTE rem=1"),
        ask("[service=service_1] ; [service=service_2]", "OK: OVER 1/MINUTE rem=0 ; OK 2/MINUTE rem=0"),
        ask("[service=service_1] ; [service=service_2]", "OVER_LIMIT: OVER 1/MINUTE rem=0 ; OVER 2/MINUTE rem=0"),
    ]),
    # The reference's counter passes the limit (the third stream's own hit takes it to 3), and a look
    # is OVER only past the limit: at exactly 2 it answers OK with 0 left. sluice never counts past a
    # limit, so its look is OVER once nothing is left: the third check is refused, and a limit of 2
    # lets 2 streams through where the reference lets 3.
    Scenario("token_quota", "integration-test/scripts/token-quota.sh", EXAMPLE_YAML, [
        ask("[service=service_2](h=0)", "OK: OK 2/MINUTE rem=2"),
        ask("[service=service_2](h=1)", "OK: OK 2/MINUTE rem=1"),
        ask("[service=service_2](h=0)", "OK: OK 2/MINUTE rem=1"),
        ask("[service=service_2](h=1)", "OK: OK 2/MINUTE rem=0"),
        ask("[service=service_2](h=0)", "OVER_LIMIT: OVER 2/MINUTE rem=0"),
        ask("[service=service_2](h=1)", "OVER_LIMIT: OVER 2/MINUTE rem=0"),
        ask("[service=service_2](h=0)", "OVER_LIMIT: OVER 2/MINUTE rem=0"),
    ], differs="a look (hits_addend 0) at a counter with nothing left is OVER_LIMIT; the reference answers OK with 0"
               " remaining until a hit has taken its counter past the limit"),
]

# The reference answers these with gRPC status UNKNOWN (its errors are plain Go errors); sluiced
# says what they are: the caller's request is invalid.
INVALID_REQUESTS = [("", "[hello=world]"), ("svc", "")]


def parse_request(rls, domain, text, hits):
    req = rls.RateLimitRequest(domain=domain, hits_addend=hits)
    for part in filter(None, (p.strip() for p in text.split(";"))):
        m = re.fullmatch(r"\[(.*)\](?:\(h=(\d+)\))?(?:\{(\d+)/(\w+)\})?", part)
        assert m, part
        d = req.descriptors.add()
        for pair in filter(None, m.group(1).split(",")):
            k, v = pair.split("=", 1)
            d.entries.add(key=k, value=v)
        if m.group(2) is not None:
            d.hits_addend.value = int(m.group(2))
        if m.group(3) is not None:
            d.limit.requests_per_unit = int(m.group(3))
            d.limit.unit = UNIT_NUMBERS[m.group(4)]
    return req


class EnvoyReferenceScenarios(unittest.TestCase):
    backend = "memory"

    @classmethod
    def setUpClass(cls):
        cls.protos = tempfile.TemporaryDirectory(prefix="sluice-protos-")
        cls.rls = compile_protos(cls.protos.name)
        cls.redis = RedisServer() if cls.backend == "redis" else None

    @classmethod
    def tearDownClass(cls):
        if cls.redis:
            cls.redis.close()
        cls.protos.cleanup()

    def start(self, scenario):
        yaml_dir = tempfile.TemporaryDirectory(prefix="sluiced-envoy-")
        with open(os.path.join(yaml_dir.name, "domain.yaml"), "w") as f:
            f.write(scenario.yaml)
        backend = '[backend]\ntype = "memory"\n'
        if self.redis:
            self.redis.cli("FLUSHALL")
            backend = '[backend]\ntype = "redis"\naddresses = ["%s"]\ntimeout_ms = 2000\n' % self.redis.address
        s = Sluiced('[server]\nthreads = 2\ngrpc_listen = "127.0.0.1:0"\n%s[envoy]\nconfig_dir = "%s"\n'
                    'all_or_nothing = false\n%s' % (backend, yaml_dir.name, scenario.envoy))
        port = s.grpc_port()
        if self.redis:
            wait_for(lambda: s.request("GET", "/readyz").status == 200, what="sluiced to reach Redis")
        return s, yaml_dir, grpc.insecure_channel("127.0.0.1:%d" % port)

    @staticmethod
    def fresh_window(scenario):
        """Waits for the next window of the scenario's unit when too little of this one is left."""
        unit = UNITS[scenario.window]
        left = unit - time.time() % unit
        if left < scenario.seconds:
            time.sleep(left + 0.05)

    def check_status(self, where, status, want):
        words = want.split()
        if words == ["UNL"]:
            self.assertEqual((CODE_NAMES[status.code], status.HasField("current_limit"), status.limit_remaining),
                             ("OK", False, 4294967295), where)
            return
        self.assertEqual(CODE_NAMES[status.code], {"OK": "OK", "OVER": "OVER_LIMIT"}[words[0]], where)
        if words[1] == "-":
            self.assertFalse(status.HasField("current_limit"), where)
            self.assertEqual(status.limit_remaining, 0, where)
            return
        rpu, unit = words[1].split("/")
        name = words[2].strip("'") if words[2].startswith("'") else ""
        self.assertEqual((status.current_limit.requests_per_unit, UNIT_NAMES.get(status.current_limit.unit),
                          status.current_limit.name), (int(rpu), unit, name), where)
        self.assertEqual(status.limit_remaining, int(words[-1].split("=")[1]), where)
        # The reset: whole seconds to the end of the unit's window, aligned to the epoch; none for a
        # limit of 0, which no wait lifts (see the replaces scenario).
        reset = status.duration_until_reset.seconds
        if int(rpu) == 0:
            self.assertFalse(status.HasField("duration_until_reset"), where)
        else:
            self.assertTrue(1 <= reset <= UNITS.get(unit, 86400), "%s: reset %d" % (where, reset))

    def counters(self, s, domain, descriptor):
        text = s.request("GET", "/metrics").body.decode()
        out = {}
        for family in ("hits", "over_limit", "near_limit", "within_limit", "shadow_mode"):
            m = re.search(r'sluice_envoy_%s_total\{domain="%s",descriptor="%s"\} (\d+)'
                          % (family, re.escape(domain), re.escape(descriptor)), text)
            out[family] = int(m.group(1)) if m else 0
        return out

    def run_scenario(self, scenario):
        domain = re.match(r"domain: (\S+)", scenario.yaml).group(1)
        s, yaml_dir, channel = self.start(scenario)
        call = should_rate_limit(channel, self.rls)
        try:
            self.fresh_window(scenario)
            for n, step in enumerate(scenario.steps):
                where = "%s (%s), step %d: %s" % (scenario.name, scenario.source, n + 1, step[2])
                if step[0] == "stats":
                    got = self.counters(s, domain, step[1])
                    self.assertEqual({k: got[k] for k in step[2]}, step[2], "%s, %s" % (where, step[1]))
                    continue
                _, step_domain, request, hits, expect = step
                answer = call(parse_request(self.rls, step_domain or domain, request, hits), timeout=10)
                overall, _, statuses = expect.partition(":")
                self.assertEqual(CODE_NAMES[answer.overall_code], overall.strip(), where)
                wants = [w.strip() for w in statuses.split(";")]
                self.assertEqual(len(answer.statuses), len(wants), where)
                for i, (status, want) in enumerate(zip(answer.statuses, wants)):
                    self.check_status("%s, descriptor %d" % (where, i), status, want)
        finally:
            channel.close()
            code = s.stop()
            log = s.log_text()
            s.dir.cleanup()
            yaml_dir.cleanup()
            self.assertEqual(code, 0, "sluiced did not exit cleanly:\n" + log[-4000:])

    def test_invalid_requests_are_invalid_argument(self):
        scenario = Scenario("invalid", "ratelimit_test.go TestEmptyDomain, TestEmptyDescriptors", FOO_YAML, [])
        s, yaml_dir, channel = self.start(scenario)
        call = should_rate_limit(channel, self.rls)
        try:
            for domain, request in INVALID_REQUESTS:
                with self.assertRaises(grpc.RpcError) as caught:
                    call(parse_request(self.rls, domain, request, 0), timeout=10)
                self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT, (domain, request))
        finally:
            channel.close()
            s.stop()
            s.dir.cleanup()
            yaml_dir.cleanup()


def add_scenario_tests(cls):
    for scenario in SCENARIOS:
        def test(self, scenario=scenario):
            self.run_scenario(scenario)
        test.__doc__ = scenario.source
        setattr(cls, "test_" + scenario.name, test)


add_scenario_tests(EnvoyReferenceScenarios)


class EnvoyReferenceScenariosOnRedis(EnvoyReferenceScenarios):
    backend = "redis"


if __name__ == "__main__":
    unittest.main(verbosity=2)
