# SPDX-License-Identifier: Apache-2.0
"""sluiced taking rules from a real etcd (etcd-server 3.4): rules added, changed and deleted on two
instances, a bad value rejected alone, etcd down at start and restarted under load, auth, TLS, a
flood of puts."""

import base64
import http.client
import json
import os
import re
import sys
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sluiced_harness import EtcdServer, RedisServer, Sluiced, TcpProxy, wait_for  # noqa: E402

FILE_RULES = """
[server]
watch_interval_ms = 0

[[rules]]
name = "api"
algorithm = "fixed_window"
limit = 2
window = "1h"
"""


def etcd_config(endpoint, extra=""):
    return FILE_RULES + '\n[etcd]\nendpoints = ["%s"]\nprefix = "/sluice/"\ndial_timeout_ms = 1000\n%s' % (endpoint, extra)


def rules_of(s):
    r = s.request("GET", "/v1/rules")
    assert r.status == 200, r.body
    return r.json()


def rule_named(s, name):
    for r in rules_of(s)["rules"]:
        if r["name"] == name:
            return r
    return None


def limit_of(s, name):
    r = rule_named(s, name)
    return r and r.get("limit")


def metric(s, name):
    text = s.request("GET", "/metrics").body.decode()
    m = re.search("^" + re.escape(name) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def window_rule(limit):
    return json.dumps({"algorithm": "fixed_window", "limit": limit, "window": "1h"})


class EtcdRules(unittest.TestCase):
    def setUp(self):
        self.etcd = EtcdServer()
        self.addCleanup(self.etcd.close)

    def start(self, extra=""):
        s = Sluiced(etcd_config(self.etcd.endpoint, extra))
        self.addCleanup(s.close)
        return s

    def test_rule_added_changed_deleted_on_two_instances(self):
        a, b = self.start(), self.start()
        for s in (a, b):
            wait_for(lambda: rules_of(s)["sources"][1]["connected"], what="etcd connected")
            self.assertEqual(limit_of(s, "api"), 2)
            self.assertEqual(rule_named(s, "api")["source"], "file")
        # Changed: etcd's rule of the same name overrides the file's.
        rev = self.etcd.put("/sluice/rules/api", window_rule(5))
        for s in (a, b):
            wait_for(lambda: limit_of(s, "api") == 5, what="the etcd rule on both instances")
            r = rule_named(s, "api")
            self.assertEqual((r["source"], r["key"], r["mod_revision"]), ("etcd", "/sluice/rules/api", rev))
            self.assertEqual(s.check(rule="api", key="k").json()["limit"], 5)
        # Added: a rule only etcd has is served.
        self.etcd.put("/sluice/rules/extra", json.dumps({"algorithm": "token_bucket", "rate": 1, "burst": 3}))
        for s in (a, b):
            wait_for(lambda: rule_named(s, "extra") is not None, what="the added rule")
            self.assertEqual(s.check(rule="extra", key="k", cost=3).status, 200)
            self.assertEqual(s.check(rule="extra", key="k").status, 429)
        # Deleted: the file's rule of that name is back; a rule only etcd had is gone.
        self.etcd.delete("/sluice/rules/api")
        self.etcd.delete("/sluice/rules/extra")
        for s in (a, b):
            wait_for(lambda: limit_of(s, "api") == 2 and rule_named(s, "extra") is None, what="the file's rule back")
            self.assertEqual(rule_named(s, "api")["source"], "file")
            self.assertEqual(s.check(rule="extra", key="k").status, 404)
        self.assertEqual(metric(a, 'sluice_config_source_up{source="etcd"}'), 1)
        self.assertGreaterEqual(metric(a, 'sluice_config_revision{source="etcd"}'), rev)

    def test_unchanged_rules_keep_their_state(self):
        s = self.start()
        self.etcd.put("/sluice/rules/other", window_rule(3))
        wait_for(lambda: rule_named(s, "other") is not None, what="rule other")
        self.assertEqual(s.check(rule="api", key="k").json()["remaining"], 1)
        self.assertEqual(s.check(rule="other", key="k").json()["remaining"], 2)
        self.etcd.put("/sluice/rules/third", window_rule(1))  # another rule changes
        wait_for(lambda: rule_named(s, "third") is not None, what="rule third")
        self.assertEqual(s.check(rule="api", key="k").json()["remaining"], 0)
        self.assertEqual(s.check(rule="other", key="k").json()["remaining"], 1)

    def test_invalid_value_is_rejected_alone_and_counted(self):
        s = self.start()
        rev = self.etcd.put("/sluice/rules/api", window_rule(7))
        wait_for(lambda: limit_of(s, "api") == 7, what="the first version")
        bad_rev = self.etcd.put("/sluice/rules/api", '{"algorithm":"fixed_window","limit":-1,"window":"1h"}')
        self.etcd.put("/sluice/rules/garbage", "\xff not json")
        good_rev = self.etcd.put("/sluice/rules/fine", window_rule(4))
        wait_for(lambda: rule_named(s, "fine") is not None, what="the good rule beside the bad ones")
        r = rule_named(s, "api")
        self.assertEqual((r["limit"], r["mod_revision"]), (7, rev), "the previous version stays in force")
        self.assertEqual(rule_named(s, "garbage"), None)
        self.assertEqual(rule_named(s, "fine")["mod_revision"], good_rev)
        wait_for(lambda: metric(s, 'sluice_config_errors_total{source="etcd"}') == 2, what="two errors counted")
        log = s.log_text()
        self.assertIn("key=/sluice/rules/api mod_revision=%d" % bad_rev, log)
        self.assertIn("limit must be between", log)
        self.assertEqual(s.request("GET", "/readyz").status, 200)

    def test_over_size_value_is_rejected_and_the_rule_in_force_kept(self):
        s = self.start()
        rev = self.etcd.put("/sluice/rules/api", window_rule(7))
        wait_for(lambda: limit_of(s, "api") == 7, what="the first version")
        self.assertEqual(s.check(rule="api", key="k").json()["remaining"], 6)
        reloads = s.log_text().count("event=reload result=success")
        big = json.dumps({"algorithm": "fixed_window", "limit": 9, "window": "1h", "pad": "x" * 70000})
        big_rev = self.etcd.put("/sluice/rules/api", big)
        wait_for(lambda: metric(s, 'sluice_config_errors_total{source="etcd"}') == 1, what="the over-size value counted")
        r = rule_named(s, "api")
        self.assertEqual((r["limit"], r["source"], r["mod_revision"]), (7, "etcd", rev), "the rule in force stays")
        d = s.check(rule="api", key="k").json()
        self.assertEqual((d["limit"], d["remaining"]), (7, 5), "and keeps its state")
        rejected = rules_of(s)["sources"][1]["rejected"]
        self.assertEqual([(x["key"], x["mod_revision"]) for x in rejected], [("/sluice/rules/api", big_rev)])
        self.assertIn("over max_value_bytes (65536)", rejected[0]["error"])
        log = s.log_text()
        self.assertIn("event=config_rejected source=etcd key=/sluice/rules/api mod_revision=%d" % big_rev, log)
        self.assertEqual(log.count("event=reload result=success"), reloads, "nothing was reloaded")
        # A new key over the bound is refused the same way; a good version is taken again.
        self.etcd.put("/sluice/rules/huge", big)
        wait_for(lambda: metric(s, 'sluice_config_errors_total{source="etcd"}') == 2, what="the new key counted")
        self.assertIsNone(rule_named(s, "huge"))
        self.assertEqual(s.check(rule="huge", key="k").status, 404)
        self.etcd.delete("/sluice/rules/huge")
        self.etcd.put("/sluice/rules/api", window_rule(8))
        wait_for(lambda: limit_of(s, "api") == 8, what="a good version again")
        self.assertEqual(rules_of(s)["sources"][1]["rejected"], [])
        self.assertEqual(s.check(rule="api", key="k").json()["remaining"], 5, "a raised limit keeps what was used")

    def test_losing_and_regaining_etcd_is_logged(self):
        s = self.start()
        wait_for(lambda: "event=config_source_up source=etcd" in s.log_text(), what="the first connection logged")
        rev = self.etcd.put("/sluice/rules/api", window_rule(4))
        wait_for(lambda: limit_of(s, "api") == 4, what="the etcd rule")
        self.etcd.kill()
        wait_for(lambda: "event=config_source_down source=etcd error=" in s.log_text(), what="the loss logged")
        line = re.search(r"^.*event=config_source_down source=etcd error=.*$", s.log_text(), re.M).group(0)
        self.assertIn("level=warning", line)
        self.assertIn(self.etcd.endpoint, line, "with the reason")
        self.assertNotEqual(rules_of(s)["sources"][1]["detail"], "")
        self.etcd.start()
        wait_for(lambda: rules_of(s)["sources"][1]["connected"], timeout=30, what="the watch back")
        ups = wait_for(lambda: [int(m) for m in re.findall(r"event=config_source_up source=etcd revision=(\d+)",
                                                          s.log_text())][1:], what="the return logged")
        self.assertGreaterEqual(ups[0], rev, "with the revision")
        self.assertEqual(rules_of(s)["sources"][1]["detail"], "", "the error is cleared once connected")
        self.assertEqual(s.log_text().count("event=config_source_down"), 1)
        self.assertEqual(limit_of(s, "api"), 4)

    def test_etcd_down_at_start_then_up(self):
        self.etcd.kill()
        s = self.start()
        self.assertEqual(s.check(rule="api", key="k").json()["limit"], 2, "the file's rules serve meanwhile")
        self.assertEqual(s.request("GET", "/readyz").status, 200, "readiness does not wait for etcd")
        self.assertFalse(rules_of(s)["sources"][1]["connected"])
        self.assertEqual(metric(s, 'sluice_config_source_up{source="etcd"}'), 0)
        self.etcd.start()
        self.etcd.put("/sluice/rules/api", window_rule(9))
        wait_for(lambda: limit_of(s, "api") == 9, timeout=30, what="etcd's rule once etcd answers")
        self.assertTrue(rules_of(s)["sources"][1]["connected"])

    def test_etcd_restarted_under_load(self):
        s = self.start()
        self.etcd.put("/sluice/rules/load", json.dumps({"algorithm": "token_bucket", "rate": 1000000, "burst": 1000000}))
        wait_for(lambda: rule_named(s, "load") is not None, what="rule load")
        statuses, stop = [], threading.Event()
        loader = s.client()

        def load():
            while not stop.is_set() and len(statuses) < 20000:
                statuses.append(loader.check(rule="load", key="k").status)

        t = threading.Thread(target=load)
        t.start()
        try:
            self.etcd.kill()
            wait_for(lambda: not rules_of(s)["sources"][1]["connected"], what="the watch lost")
            self.etcd.start()
            rev = self.etcd.put("/sluice/rules/api", window_rule(6))
            wait_for(lambda: limit_of(s, "api") == 6, timeout=30, what="a change made after the restart")
            self.assertEqual(rule_named(s, "api")["mod_revision"], rev)
        finally:
            stop.set()
            t.join()
        self.assertGreater(len(statuses), 0)
        self.assertEqual(set(statuses), {200}, "no check failed while etcd was away")
        self.assertEqual(rule_named(s, "load")["source"], "etcd", "the last good set stayed in force")

    def test_compaction_while_disconnected_rereads_the_prefix(self):
        proxy = TcpProxy(self.etcd.port)
        self.addCleanup(proxy.close)
        s = Sluiced(etcd_config("127.0.0.1:%d" % proxy.port, "backoff_base_ms = 100\nbackoff_cap_ms = 300\n"))
        self.addCleanup(s.close)
        self.etcd.put("/sluice/rules/api", window_rule(5))
        self.etcd.put("/sluice/rules/gone", window_rule(1))
        wait_for(lambda: limit_of(s, "api") == 5 and rule_named(s, "gone") is not None, what="the first set")
        proxy.cut()
        wait_for(lambda: not rules_of(s)["sources"][1]["connected"], what="the watch lost")
        for limit in (6, 7, 8):
            self.etcd.put("/sluice/rules/api", window_rule(limit))
        self.etcd.delete("/sluice/rules/gone")
        rev = self.etcd.put("/sluice/rules/new", window_rule(3))
        self.etcd.ctl("compact", str(rev), "--physical")
        proxy.restore()
        wait_for(lambda: rules_of(s)["sources"][1]["connected"], timeout=30, what="the watch back")
        wait_for(lambda: limit_of(s, "api") == 8, what="the final version after the re-read")
        self.assertIsNone(rule_named(s, "gone"), "a key deleted while away is gone")
        self.assertEqual(rule_named(s, "new")["mod_revision"], rev)
        self.assertGreaterEqual(metric(s, 'sluice_config_revision{source="etcd"}'), rev)

    def test_flood_of_puts(self):
        # ASan keeps freed memory in quarantine; without it, RSS shows what sluiced really holds.
        env = dict(os.environ, ASAN_OPTIONS="quarantine_size_mb=0:" + os.environ.get("ASAN_OPTIONS", ""))
        s = Sluiced(etcd_config(self.etcd.endpoint), env=env)
        self.addCleanup(s.close)
        conn = http.client.HTTPConnection("127.0.0.1", self.etcd.port, timeout=10)

        def put(key, value):
            body = json.dumps({"key": base64.b64encode(key.encode()).decode(),
                               "value": base64.b64encode(value.encode()).decode()})
            conn.request("POST", "/v3/kv/put", body, {"Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            self.assertEqual(r.status, 200)

        rss_before = rss_kib(s.proc.pid)
        for i in range(10000):
            put("/sluice/rules/r%d" % (i % 100), window_rule(i + 1))  # the last of each: 9901..10000
        conn.close()
        wait_for(lambda: limit_of(s, "r99") == 10000, timeout=60, what="the last put applied")
        rules = {r["name"]: r for r in rules_of(s)["rules"]}
        for k in range(100):
            self.assertEqual(rules["r%d" % k]["limit"], 9901 + k)
        self.assertLess(rss_kib(s.proc.pid) - rss_before, 128 * 1024, "memory stays bounded")

    def test_auth_with_user_and_password(self):
        self.etcd.enable_auth("s3cret")
        self.etcd.put("/sluice/rules/api", window_rule(8))
        s = self.start('username = "root"\npassword = "s3cret"\n')
        wait_for(lambda: limit_of(s, "api") == 8, what="rules read with a token")
        self.etcd.put("/sluice/rules/api", window_rule(11))
        wait_for(lambda: limit_of(s, "api") == 11, what="the watch with a token")
        bad = self.start('username = "root"\npassword = "wrong"\n')
        self.assertEqual(limit_of(bad, "api"), 2, "a refused login leaves the file's rules")
        wait_for(lambda: rules_of(bad)["sources"][1]["detail"] != "", what="the error reported")


class EtcdTls(unittest.TestCase):
    def test_tls_with_a_ca_and_client_certificates(self):
        etcd = EtcdServer(tls=True)
        self.addCleanup(etcd.close)
        etcd.put("/sluice/rules/api", window_rule(12))
        s = Sluiced(etcd_config(etcd.endpoint, 'ca_file = "%s"\ncert_file = "%s"\nkey_file = "%s"\n' %
                                (etcd.ca, etcd.cert, etcd.key)))
        self.addCleanup(s.close)
        wait_for(lambda: limit_of(s, "api") == 12, what="rules over TLS")


OVERRIDE_RULES = """
[server]
watch_interval_ms = 0

[[rules]]
name = "api"
algorithm = "token_bucket"
rate = 0.001
burst = 2

[[rules]]
name = "tenant_api"
algorithm = "fixed_window"
window = "1h"
tenant_limit = 3
user_limit = 1

[[rules]]
name = "quota"
algorithm = "fixed_window"
window = "1h"
limit = 2

[[overrides]]
rule = "quota"
key = "vip"
limit = 5
"""


class Overrides(unittest.TestCase):
    """Per key, per tenant and per tenant's user, from the file and from etcd, on each backend."""

    def run_overrides(self, backend_toml):
        etcd = EtcdServer()
        self.addCleanup(etcd.close)
        s = Sluiced(OVERRIDE_RULES + backend_toml + '\n[etcd]\nendpoints = ["%s"]\n' % etcd.endpoint)
        self.addCleanup(s.close)
        wait_for(lambda: rules_of(s)["sources"][1]["connected"], what="etcd connected")
        self.assertEqual(rules_of(s)["overrides"], 1)
        # The file's override: its figures and headers show its limit.
        r = s.check(rule="quota", key="vip")
        self.assertEqual((r.status, r.json()["limit"], r.headers["x-ratelimit-limit"]), (200, 5, "5"))
        self.assertEqual(s.check(rule="quota", key="vip").json()["remaining"], 3)
        self.assertEqual(s.check(rule="quota", key="other").json()["limit"], 2)
        # etcd: one key of a token bucket.
        etcd.put("/sluice/overrides/u42", json.dumps({"rule": "api", "key": "user:42", "rate": 1, "burst": 10}))
        wait_for(lambda: rules_of(s)["overrides"] == 2, what="the key's override")
        self.assertEqual(s.check(rule="api", key="user:42", cost=10).status, 200)
        self.assertEqual(s.check(rule="api", key="user:41", cost=3).status, 400, "others keep burst 2")
        # etcd: a tenant, then one of its users.
        etcd.put("/sluice/overrides/acme", json.dumps({"rule": "tenant_api", "tenant": "acme", "tenant_limit": 100,
                                                       "user_limit": 2}))
        etcd.put("/sluice/overrides/acme-carol", json.dumps({"rule": "tenant_api", "tenant": "acme", "user": "carol",
                                                             "user_limit": 4}))
        wait_for(lambda: rules_of(s)["overrides"] == 4, what="the tenant's overrides")
        self.assertEqual([s.check(rule="tenant_api", tenant="acme", user="bob").status for _ in range(3)], [200, 200, 429])
        self.assertEqual(s.check(rule="tenant_api", tenant="acme", user="bob").json()["rejected_by"], "user")
        self.assertEqual([s.check(rule="tenant_api", tenant="acme", user="carol").status for _ in range(5)],
                         [200, 200, 200, 200, 429])
        self.assertEqual([s.check(rule="tenant_api", tenant="other", user="bob").status for _ in range(2)], [200, 429])
        # An etcd override of the file's target replaces it, keeping what the key used.
        etcd.put("/sluice/overrides/vip", json.dumps({"rule": "quota", "key": "vip", "limit": 6}))
        wait_for(lambda: s.check(rule="quota", key="other2").status == 200 and
                 rule_named(s, "quota") is not None and rules_of(s)["overrides"] == 4 and
                 s.request("GET", "/v1/rules").json()["version"] >= 5, what="the replacing override")
        r = s.check(rule="quota", key="vip")
        self.assertEqual((r.json()["limit"], r.json()["remaining"]), (6, 3), "a raised limit keeps what was used")
        # A bad override is rejected alone; a deleted one gives the rule's limits back.
        etcd.put("/sluice/overrides/bad", json.dumps({"rule": "quota", "key": "x", "rate": 5}))
        wait_for(lambda: metric(s, 'sluice_config_errors_total{source="etcd"}') == 1, what="the bad override counted")
        etcd.put("/sluice/overrides/dup", json.dumps({"rule": "tenant_api", "tenant": "acme", "user": "carol",
                                                      "user_limit": 9}))
        wait_for(lambda: metric(s, 'sluice_config_errors_total{source="etcd"}') == 2, what="a second override refused")
        self.assertEqual(rules_of(s)["overrides"], 4)
        self.assertIn("another override in force has the same rule and key", s.log_text())
        etcd.delete("/sluice/overrides/u42")
        wait_for(lambda: rules_of(s)["overrides"] == 3, what="the override deleted")
        self.assertEqual(s.check(rule="api", key="user:42").json()["limit"], 2)

    def test_memory_backend(self):
        self.run_overrides("")

    def test_redis_backend(self):
        redis = RedisServer()
        self.addCleanup(redis.close)
        self.run_overrides('\n[backend]\ntype = "redis"\naddresses = ["127.0.0.1:%d"]\n' % redis.port)


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


if __name__ == "__main__":
    unittest.main(verbosity=2)
