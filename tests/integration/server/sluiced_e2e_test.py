#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""End-to-end tests of sluiced over real HTTP, memory backend: fields, headers, both config forms,
every error code, batch, disabled limiting, metrics, hot reload (valid and invalid), SIGTERM.

Usage: SLUICED=/path/to/sluiced python3 sluiced_e2e_test.py
"""

import datetime
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

sys.dont_write_bytecode = True  # keep the source tree clean
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sluiced_harness import Sluiced, wait_for, SLUICED  # noqa: E402

# The seed's section, unchanged.
SEED = """[ratelimit]
enabled = true
algorithm = "sliding_window"   # token_bucket | sliding_window
token_rate = 10                # token bucket: tokens per second
token_burst = 20               # token bucket: bucket size
window = 60                    # sliding window: seconds
limit = 100                    # sliding window: requests per window
"""

# The full form. Rates are tiny so that nothing refills while a test runs.
FULL = """[server]
listen = "127.0.0.1:8080"
threads = 2
log_rejections = true
admin_token = "e2e-admin-token-0123"

[backend]
type = "memory"

[[rules]]
name = "api"
algorithm = "token_bucket"
rate = 0.01
burst = 5

[[rules]]
name = "ai"
algorithm = "sliding_window"
limit = 3
window = "60s"

[[rules]]
name = "quota"
algorithm = "fixed_window"
limit = 2
window = "1h"

[[rules]]
name = "counter"
algorithm = "sliding_window_counter"
limit = 2
window = "5m"

[[rules]]
name = "tenant_api"
algorithm = "sliding_window"
window = "60s"
tenant_limit = 3
user_limit = 2

[[rules]]
name = "monthly"
algorithm = "fixed_window"
limit = 2
window = "calendar_month"

[[rules]]
name = "shadowed"
algorithm = "fixed_window"
limit = 1
window = "1h"
shadow = true
"""


class SluicedTest(unittest.TestCase):
    def start(self, config, *args):
        s = Sluiced(config, extra_args=args)
        self.addCleanup(s.close)
        return s

    def assert_headers(self, r, limit, remaining):
        self.assertEqual(r.headers["x-ratelimit-limit"], str(limit))
        self.assertEqual(r.headers["x-ratelimit-remaining"], str(remaining))
        reset = int(r.headers["x-ratelimit-reset"])
        expected = time.time() + r.json()["reset_after_ms"] / 1000.0
        self.assertLessEqual(abs(reset - expected), 2.0, "X-RateLimit-Reset is Unix seconds when full again")
        self.assertEqual(r.headers["content-type"], "application/json")


class Systemd(SluicedTest):
    def test_notifies_ready_reloading_and_stopping(self):
        # What systemd's Type=notify reads: sd_notify datagrams on $NOTIFY_SOCKET.
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "notify")
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self.addCleanup(sock.close)
            sock.bind(path)
            sock.settimeout(20)
            # No file watch: the SIGHUP below is the one reload.
            config = "[server]\nwatch_interval_ms = 0\n" + SEED
            s = Sluiced(config, env=dict(os.environ, NOTIFY_SOCKET=path))
            self.addCleanup(s.close)
            self.assertEqual(sock.recv(4096), b"READY=1")
            s.reload(config)
            self.assertEqual(sock.recv(4096), b"RELOADING=1")
            self.assertEqual(sock.recv(4096), b"READY=1")
            s.stop()
            self.assertEqual(sock.recv(4096), b"STOPPING=1")


class SeedForm(SluicedTest):
    def test_seed_section_defines_rule_default(self):
        s = self.start(SEED)
        for i in range(100):
            r = s.check(key="user:1")
            self.assertEqual(r.status, 200, r.body)
            body = r.json()
            self.assertEqual(body["rule"], "default")
            self.assertTrue(body["allowed"])
            self.assertEqual(body["limit"], 100)
            self.assertEqual(body["remaining"], 99 - i)
            self.assertEqual(body["retry_after_ms"], 0)
            self.assertNotIn("retry-after", r.headers)
        self.assert_headers(r, 100, 0)
        r = s.check(key="user:1")
        self.assertEqual(r.status, 429)
        body = r.json()
        self.assertFalse(body["allowed"])
        self.assertEqual(body["remaining"], 0)
        self.assertGreater(body["retry_after_ms"], 0)
        self.assertLessEqual(body["retry_after_ms"], 60000)
        retry = int(r.headers["retry-after"])
        self.assertGreaterEqual(retry, 1)
        self.assertLessEqual(retry, 60)
        self.assertEqual(retry, -(-body["retry_after_ms"] // 1000), "Retry-After is retry_after rounded up")
        self.assert_headers(r, 100, 0)
        # Another key has its own window.
        self.assertEqual(s.check(key="user:2").status, 200)
        # Explicit rule "default" is the same limiter.
        self.assertEqual(s.check(rule="default", key="user:1").status, 429)
        # Without [server] admin_token, resets are off.
        self.assertEqual(s.reset("any-token-0123456789", key="user:1").status, 403)
        # IETF fields are off unless switched on.
        self.assertNotIn("ratelimit", r.headers)
        self.assertNotIn("ratelimit-policy", r.headers)

    def test_seed_token_bucket(self):
        s = self.start(SEED.replace('algorithm = "sliding_window"', 'algorithm = "token_bucket"'))
        start = time.monotonic()
        statuses = []
        while 429 not in statuses and len(statuses) < 500:
            statuses.append(s.check(key="k").status)
        elapsed = time.monotonic() - start
        admitted = statuses.count(200)
        # burst 20, refilling 10/s: the whole burst, plus at most what refilled meanwhile.
        self.assertIn(429, statuses)
        self.assertGreaterEqual(admitted, 20)
        self.assertLessEqual(admitted, 20 + int(elapsed * 10) + 1)
        r = s.check(key="other")
        self.assertEqual(r.json()["limit"], 20)


class FullForm(SluicedTest):
    @classmethod
    def setUpClass(cls):
        cls.s = Sluiced(FULL)

    @classmethod
    def tearDownClass(cls):
        cls.s.close()

    def test_token_bucket_fields_and_headers(self):
        s = self.s
        r = s.check(rule="api", key="tb:1", cost=1)
        self.assertEqual(r.status, 200)
        body = r.json()
        self.assertEqual(set(body), {"allowed", "rule", "limit", "remaining", "retry_after_ms", "reset_after_ms"})
        self.assertEqual(body["rule"], "api")
        self.assertEqual(body["limit"], 5)
        self.assertEqual(body["remaining"], 4)
        self.assertEqual(body["retry_after_ms"], 0)
        self.assertGreater(body["reset_after_ms"], 99000)  # one token at 0.01/s: 100 s to refill
        self.assertLessEqual(body["reset_after_ms"], 100000)
        self.assert_headers(r, 5, 4)
        r = s.check(rule="api", key="tb:1", cost=4)
        self.assertEqual(r.status, 200)
        self.assertEqual(r.json()["remaining"], 0)
        r = s.check(rule="api", key="tb:1")
        self.assertEqual(r.status, 429)
        body = r.json()
        self.assertFalse(body["allowed"])
        self.assertGreater(body["retry_after_ms"], 90000)
        self.assertEqual(int(r.headers["retry-after"]), -(-body["retry_after_ms"] // 1000))
        self.assert_headers(r, 5, 0)

    def test_cost_defaults_to_one_and_counts(self):
        s = self.s
        self.assertEqual(s.check(rule="api", key="cost:1").json()["remaining"], 4)
        self.assertEqual(s.check(rule="api", key="cost:1", cost=3).json()["remaining"], 1)
        r = s.check(rule="api", key="cost:1", cost=2)
        self.assertEqual(r.status, 429, "a refusal takes nothing")
        self.assertEqual(s.check(rule="api", key="cost:1", cost=1).json()["remaining"], 0)

    def test_window_algorithms(self):
        s = self.s
        for rule, limit in (("ai", 3), ("quota", 2), ("counter", 2)):
            for i in range(limit):
                r = s.check(rule=rule, key="w:1")
                self.assertEqual(r.status, 200, (rule, r.body))
                self.assertEqual(r.json()["remaining"], limit - 1 - i)
            r = s.check(rule=rule, key="w:1")
            self.assertEqual(r.status, 429, rule)
            self.assertGreaterEqual(int(r.headers["retry-after"]), 1)

    def test_dual_layer(self):
        s = self.s
        r = s.check(rule="tenant_api", tenant="t1", user="u1")
        self.assertEqual(r.status, 200)
        body = r.json()
        self.assertEqual(body["layers"], {"tenant": {"limit": 3, "remaining": 2}, "user": {"limit": 2, "remaining": 1}})
        self.assertEqual(body["remaining"], 1, "remaining is the smaller layer's")
        self.assertNotIn("rejected_by", body)
        self.assertEqual(r.headers["x-ratelimit-remaining"], "1")
        self.assertEqual(s.check(rule="tenant_api", tenant="t1", user="u1").status, 200)
        r = s.check(rule="tenant_api", tenant="t1", user="u1")
        self.assertEqual(r.status, 429)
        self.assertEqual(r.json()["rejected_by"], "user")
        self.assertIn("retry-after", r.headers)
        # A second user of the same tenant takes the tenant's last unit, then the tenant refuses.
        r = s.check(rule="tenant_api", tenant="t1", user="u2")
        self.assertEqual(r.status, 200)
        self.assertEqual(r.json()["layers"]["tenant"]["remaining"], 0)
        r = s.check(rule="tenant_api", tenant="t1", user="u3")
        self.assertEqual(r.status, 429)
        self.assertEqual(r.json()["rejected_by"], "tenant")
        self.assertEqual(r.json()["layers"]["user"]["remaining"], 2, "the tenant's refusal takes nothing from the user")
        # Another tenant is untouched.
        self.assertEqual(s.check(rule="tenant_api", tenant="t2", user="u1").status, 200)

    def test_batch(self):
        s = self.s
        r = s.request("POST", "/v1/check", {"checks": [
            {"rule": "api", "key": "b:1"},
            {"rule": "api", "key": "b:1", "cost": 4},
            {"rule": "api", "key": "b:1"},
            {"rule": "missing", "key": "b:1"},
            {"rule": "api"},
            {"rule": "tenant_api", "tenant": "bt", "user": "bu"},
            {"rule": "api", "key": "b:1", "cost": 0},
        ]})
        self.assertEqual(r.status, 200)
        self.assertNotIn("x-ratelimit-limit", r.headers)
        res = r.json()["results"]
        self.assertEqual(len(res), 7)
        self.assertEqual((res[0]["allowed"], res[0]["remaining"]), (True, 4))
        self.assertEqual((res[1]["allowed"], res[1]["remaining"]), (True, 0))
        self.assertFalse(res[2]["allowed"])
        self.assertGreater(res[2]["retry_after_ms"], 0)
        self.assertEqual(res[3]["error"]["code"], "unknown_rule")
        self.assertEqual(res[4]["error"]["code"], "invalid_request")
        self.assertIn("layers", res[5])
        self.assertEqual((res[6]["allowed"], res[6]["remaining"]), (False, 0), "a look at the spent key")
        for bad in ({"checks": []}, {"checks": {}}, {"checks": [{"key": "x"}] * 1001}, {"checks": [], "rule": "api"}):
            r = s.request("POST", "/v1/check", bad)
            self.assertEqual(r.status, 400, bad if len(json.dumps(bad)) < 200 else "big batch")
            self.assertEqual(r.json()["error"]["code"], "invalid_request")

    def test_reset(self):
        s = self.s
        token = "e2e-admin-token-0123"
        self.assertEqual(s.check(rule="api", key="reset:1", cost=5).json()["remaining"], 0)
        for bad_token in (None, "wrong-token-0123456789", token + "x", token[:-1]):
            r = s.reset(bad_token, rule="api", key="reset:1")
            self.assert_error(r, 401, "unauthorized")
            self.assertEqual(r.headers["www-authenticate"], "Bearer")
        for body, status, code in [({"rule": "api"}, 400, "invalid_request"),
                                   ({"rule": "api", "key": "reset:1", "cost": 1}, 400, "invalid_request"),
                                   ({"rule": "nope", "key": "reset:1"}, 404, "unknown_rule"),
                                   ({"rule": "tenant_api", "user": "u"}, 400, "invalid_request"),
                                   ({"rule": "api", "key": "k" * 513}, 400, "invalid_request")]:
            self.assert_error(s.reset(token, **body), status, code)
        self.assertEqual(s.request("GET", "/v1/reset").status, 405)
        plain = s.request("POST", "/v1/reset", {"rule": "api", "key": "reset:1"},
                          headers={"Authorization": "Bearer " + token, "Content-Type": "text/plain"})
        self.assert_error(plain, 415, "unsupported_media_type")
        self.assertEqual(s.check(rule="api", key="reset:1").status, 429, "nothing refused reset the key")
        r = s.reset(token, rule="api", key="reset:1")
        self.assertEqual((r.status, r.json()), (200, {"reset": True}))
        self.assertEqual(s.check(rule="api", key="reset:1").json()["remaining"], 4)
        # Dual layer: a user's layer, then the tenant's own.
        for user in ("u1", "u1", "u2"):
            self.assertEqual(s.check(rule="tenant_api", tenant="rt", user=user).status, 200)
        self.assertEqual(s.check(rule="tenant_api", tenant="rt", user="u3").json()["rejected_by"], "tenant")
        self.assertEqual(s.reset(token, rule="tenant_api", tenant="rt").status, 200)
        self.assertEqual(s.check(rule="tenant_api", tenant="rt", user="u1").json()["rejected_by"], "user")
        self.assertEqual(s.reset(token, rule="tenant_api", tenant="rt", user="u1").status, 200)
        self.assertEqual(s.check(rule="tenant_api", tenant="rt", user="u1").status, 200)
        text = s.request("GET", "/metrics").body.decode()
        self.assertIn('sluice_resets_total{rule="api",result="done"} 1\n', text)
        self.assertIn('sluice_resets_total{rule="tenant_api",result="done"} 2\n', text)
        self.assertIn("event=reset rule=api key=reset:1", s.log_text())

    def test_shadow_rule_counts_logs_and_admits(self):
        s = self.s
        self.assertEqual(s.check(rule="shadowed", key="sh").json()["remaining"], 0)
        r = s.check(rule="shadowed", key="sh")
        self.assertEqual(r.status, 200)
        body = r.json()
        self.assertEqual((body["allowed"], body["remaining"], body["retry_after_ms"], body["shadow_rejected"]),
                         (True, 0, 0, True))
        self.assertNotIn("retry-after", r.headers)
        self.assertEqual(r.headers["x-ratelimit-remaining"], "0")
        batch = s.request("POST", "/v1/check", {"checks": [{"rule": "shadowed", "key": "sh"}]}).json()["results"]
        self.assertTrue(batch[0]["allowed"] and batch[0]["shadow_rejected"])
        text = s.request("GET", "/metrics").body.decode()
        self.assertIn('sluice_checks_total{rule="shadowed",result="shadow_rejected"} 2\n', text)
        self.assertIn('sluice_checks_total{rule="shadowed",result="rejected"} 0\n', text)
        wait_for(lambda: "event=check rate_limited=true shadow=true rule=shadowed key=sh" in s.log_text(),
                 what="the shadow refusal's log line")
        rules = {r["name"]: r for r in s.request("GET", "/v1/rules").json()["rules"]}
        self.assertTrue(rules["shadowed"]["shadow"])
        self.assertNotIn("shadow", rules["api"])

    def test_calendar_month_renews_on_the_first(self):
        s = self.s
        now = datetime.datetime.now(datetime.timezone.utc)
        first = datetime.datetime(now.year + (now.month == 12), now.month % 12 + 1, 1, tzinfo=datetime.timezone.utc)
        body = s.check(rule="monthly", key="m", cost=2).json()
        self.assertAlmostEqual(body["reset_after_ms"] / 1000, (first - now).total_seconds(), delta=5)
        r = s.check(rule="monthly", key="m")
        self.assertEqual(r.status, 429)
        self.assertAlmostEqual(int(r.headers["x-ratelimit-reset"]), first.timestamp(), delta=5)
        rules = {r["name"]: r for r in s.request("GET", "/v1/rules").json()["rules"]}
        self.assertEqual(rules["monthly"]["window"], "calendar_month")

    def test_look(self):
        # A cost of 0 answers as one unit would and takes nothing; /metrics counts it apart.
        s = self.s
        def looked():
            m = re.search(r'sluice_checks_total\{rule="api",result="looked"\} (\d+)', s.request("GET", "/metrics").body.decode())
            return int(m.group(1))
        before = looked()
        for _ in range(3):
            r = s.check(rule="api", key="look:1", cost=0)
            self.assertEqual((r.status, r.json()["allowed"], r.json()["remaining"]), (200, True, 5))
        self.assertEqual(s.check(rule="api", key="look:1", cost=5).json()["remaining"], 0)
        r = s.check(rule="api", key="look:1", cost=0)
        self.assertEqual((r.status, r.json()["allowed"], r.json()["remaining"]), (429, False, 0))
        self.assertIn("retry-after", r.headers)
        self.assertEqual(looked(), before + 4)
        r = s.check(rule="tenant_api", tenant="look", user="u", cost=0)
        self.assertEqual((r.status, r.json()["allowed"]), (200, True))

    def assert_error(self, r, status, code):
        self.assertEqual(r.status, status, r.body)
        self.assertEqual(r.headers["content-type"], "application/json")
        err = r.json()["error"]
        self.assertEqual(err["code"], code)
        self.assertTrue(err["message"])

    def test_errors_and_no_state_change(self):
        s = self.s
        key = "err:1"
        bad_bodies = [
            "{", "not json", "[]", '"x"', "{\"rule\": \"api\", \"key\": \"%s\"" % key,
            {"rule": "api", "key": 42},
            {"rule": "api", "key": key, "cost": "1"},
            {"rule": "api", "key": key, "cost": 1.5},
            {"rule": "api", "key": key, "cost": -3},
            {"rule": "api", "key": key, "cost": True},
            {"rule": "api", "key": key, "cost": 6},          # larger than burst: never admissible
            {"rule": "api", "key": key, "cost": 2 ** 63},
            {"rule": "api"},
            {"rule": "api", "key": ""},
            {"rule": "api", "key": "k" * 513},
            {"rule": 7, "key": key},
            {"rule": "api", "key": key, "extra": 1},
            {"rule": "api", "tenant": "t", "user": "u"},
            {"rule": "tenant_api", "key": key},
            {"rule": "tenant_api", "tenant": "t"},
            {"rule": "tenant_api", "user": "u"},
            {"rule": "tenant_api", "tenant": "t" * 513, "user": "u"},
            {"rule": "api", "key": key, "cost": None},
        ]
        for body in bad_bodies:
            r = s.request("POST", "/v1/check", body)
            self.assert_error(r, 400, "invalid_request")
        self.assert_error(s.check(rule="nope", key=key), 404, "unknown_rule")
        self.assert_error(s.check(key=key), 404, "unknown_rule")  # no [ratelimit]: no rule "default"
        # None of the above touched the limiter.
        r = s.check(rule="api", key=key)
        self.assertEqual(r.json()["remaining"], 4)
        r = s.check(rule="tenant_api", tenant="t", user="u")
        self.assertEqual(r.json()["layers"]["tenant"]["remaining"], 2)
        # The longest key accepted.
        self.assertEqual(s.check(rule="api", key="k" * 512).status, 200)

    def test_methods_paths_and_size(self):
        s = self.s
        r = s.request("GET", "/v1/check")
        self.assert_error(r, 405, "method_not_allowed")
        self.assertEqual(r.headers["allow"], "POST")
        self.assert_error(s.request("PUT", "/v1/check", {"key": "x"}), 405, "method_not_allowed")
        r = s.request("POST", "/healthz", "")
        self.assert_error(r, 405, "method_not_allowed")
        self.assertIn("GET", r.headers["allow"])
        self.assert_error(s.request("GET", "/nope"), 404, "not_found")
        self.assert_error(s.request("POST", "/v1/checks", {}), 404, "not_found")
        big = json.dumps({"rule": "api", "key": "size:1", "pad": "x" * (64 * 1024)})
        self.assert_error(s.request("POST", "/v1/check", big), 413, "payload_too_large")
        exactly = {"rule": "api", "key": "size:1"}
        self.assertEqual(s.request("POST", "/v1/check", exactly).json()["remaining"], 4, "413 changed nothing")
        # A body of exactly 64 KiB is parsed (and here rejected for its content, not its size).
        pad = 64 * 1024 - len(json.dumps({"rule": "api", "key": "size:1", "pad": ""}))
        body = json.dumps({"rule": "api", "key": "size:1", "pad": "x" * pad})
        self.assertEqual(len(body), 64 * 1024)
        self.assert_error(s.request("POST", "/v1/check", body), 400, "invalid_request")
        # A query string does not change the route.
        self.assertEqual(s.request("POST", "/v1/check?x=1", exactly).status, 200)

    def test_malformed_http(self):
        with socket.create_connection(("127.0.0.1", self.s.port), timeout=5) as c:
            c.sendall(b"NOT A REQUEST\r\n\r\n")
            data = c.recv(4096)
        self.assertTrue(data.startswith(b"HTTP/1.1 400"), data)

    def test_expect_100_continue(self):
        body = json.dumps({"rule": "ai", "key": "continue:1"}).encode()
        with socket.create_connection(("127.0.0.1", self.s.port), timeout=5) as c:
            c.sendall(b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n"
                      % len(body))
            interim = c.recv(4096)
            self.assertTrue(interim.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), interim)
            c.sendall(body)
            data = interim[len(b"HTTP/1.1 100 Continue\r\n\r\n"):]
            while b'"reset_after_ms"' not in data:
                data += c.recv(4096)
        self.assertTrue(data.startswith(b"HTTP/1.1 200 OK\r\n"), data)

    def test_pipelined_requests(self):
        body = json.dumps({"rule": "ai", "key": "pipe:1"}).encode()
        one = b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        with socket.create_connection(("127.0.0.1", self.s.port), timeout=5) as c:
            c.sendall(one * 4 + b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = b""
            while True:
                chunk = c.recv(65536)
                if not chunk:
                    break
                data += chunk
        self.assertEqual(data.count(b"HTTP/1.1 200 OK"), 3 + 1)
        self.assertEqual(data.count(b"HTTP/1.1 429 Too Many Requests"), 1, "limit 3: the fourth is refused")
        self.assertIn(b"Connection: close", data)

    def test_head_and_http10(self):
        r = self.s.request("HEAD", "/healthz")
        self.assertEqual(r.status, 200)
        self.assertEqual(r.body, b"")
        with socket.create_connection(("127.0.0.1", self.s.port), timeout=5) as c:
            c.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
            data = b""
            while True:
                chunk = c.recv(4096)
                if not chunk:
                    break
                data += chunk
        self.assertTrue(data.startswith(b"HTTP/1.1 200 OK"), data)
        self.assertIn(b"Connection: close", data, "HTTP/1.0 without keep-alive is closed after the reply")

    def test_keep_alive(self):
        import http.client
        conn = http.client.HTTPConnection("127.0.0.1", self.s.port, timeout=5)
        conn.connect()
        local = conn.sock.getsockname()
        for i in range(20):
            conn.request("POST", "/v1/check", json.dumps({"rule": "ai", "key": "ka:%d" % i}),
                         {"Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            self.assertEqual(r.status, 200)
            self.assertEqual(conn.sock.getsockname(), local, "the same connection serves every request")
        conn.close()

    def test_health_ready_metrics(self):
        s = self.s
        r = s.request("GET", "/healthz")
        self.assertEqual(r.status, 200)
        r = s.request("GET", "/readyz")
        self.assertEqual(r.status, 200)
        for _ in range(3):
            s.check(rule="quota", key="m:1")
        s.check(rule="tenant_api", tenant="mt", user="mu1")
        s.check(rule="tenant_api", tenant="mt", user="mu1")
        s.check(rule="tenant_api", tenant="mt", user="mu1")
        r = s.request("GET", "/metrics")
        self.assertEqual(r.status, 200)
        self.assertTrue(r.headers["content-type"].startswith("text/plain; version=0.0.4"))
        text = r.body.decode()
        self.assertIn("# TYPE sluice_checks_total counter", text)
        self.assertRegex(text, r'sluice_checks_total\{rule="quota",result="allowed"\} \d+')
        self.assertRegex(text, r'sluice_checks_total\{rule="quota",result="rejected"\} [1-9]\d*')
        self.assertRegex(text, r'sluice_rejections_total\{rule="quota",layer="single",tenant=""\} [1-9]')
        self.assertRegex(text, r'sluice_rejections_total\{rule="tenant_api",layer="user",tenant="mt"\} [1-9]')
        self.assertRegex(text, r'sluice_check_duration_seconds_bucket\{rule="quota",le="\+Inf"\} [1-9]')
        self.assertRegex(text, r'sluice_check_duration_seconds_count\{rule="quota"\} [1-9]')
        self.assertRegex(text, r"sluice_live_keys [1-9]\d*")
        self.assertIn('sluice_config_reloads_total{result="failure"} 0', text)
        self.assertIn("sluice_backend_ready 1", text)
        self.assertIn("sluice_fail_open_total 0", text)
        for line in text.splitlines():
            if line and not line.startswith("#"):
                self.assertRegex(line, r'^[a-z_]+(\{[^}]*\})? [0-9.e+-]+$')

    def test_rejections_logged(self):
        s = self.s
        for _ in range(3):
            s.check(rule="counter", key="logged-user")
        wait_for(lambda: "rate_limited=true rule=counter key=logged-user" in s.log_text(), timeout=5,
                 what="the rejection log line")
        s.check(rule="counter", key="evil\nuser=admin x")
        log = s.log_text()
        self.assertNotIn("\nuser=admin", log, "a key cannot forge a log line")


class JsonLogs(SluicedTest):
    def test_every_line_is_a_json_object_with_an_event(self):
        s = self.start(FULL + '\n[log]\nformat = "json"\n')
        for _ in range(3):
            s.check(rule="counter", key="json user")
        wait_for(lambda: '"rate_limited":"true"' in s.log_text(), timeout=5, what="the rejection log line")
        lines = [json.loads(line) for line in s.log_text().splitlines() if line.startswith("{")]
        self.assertTrue(any(l["event"] == "listening" for l in lines), lines)
        refusal = next(l for l in lines if l.get("rate_limited") == "true")
        self.assertEqual((refusal["level"], refusal["rule"], refusal["key"]), ("info", "counter", "json user"))
        for l in lines:
            self.assertIn("event", l)
            self.assertRegex(l["time"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


class IetfHeaders(SluicedTest):
    def test_switches(self):
        cfg = FULL + "\n[http]\nietf_headers = true\n"
        s = self.start(cfg)
        r = s.check(rule="ai", key="i:1")
        self.assertEqual(r.headers["ratelimit-policy"], '"ai";q=3;w=60')
        self.assertEqual(r.headers["ratelimit"], '"ai";r=2;t=60')
        self.assertIn("x-ratelimit-limit", r.headers)
        s2 = self.start(FULL + "\n[http]\nietf_headers = true\nlegacy_headers = false\n")
        r = s2.check(rule="ai", key="i:1")
        self.assertIn("ratelimit", r.headers)
        self.assertNotIn("x-ratelimit-limit", r.headers)
        self.assertNotIn("x-ratelimit-reset", r.headers)
        for _ in range(3):
            r = s2.check(rule="ai", key="i:1")
        self.assertEqual(r.status, 429)
        self.assertIn("retry-after", r.headers, "Retry-After is always sent on 429")


class Disabled(SluicedTest):
    def test_enabled_false_admits_everything(self):
        s = self.start(SEED.replace("enabled = true", "enabled = false") + "\n[backend]" + FULL.split("[backend]")[1])
        for _ in range(10):
            r = s.check(rule="api", key="d:1", cost=5)
            self.assertEqual(r.status, 200)
        body = r.json()
        self.assertTrue(body["allowed"])
        self.assertEqual(body["source"], "disabled")
        self.assertEqual(body["remaining"], 5)
        # Validation still applies.
        self.assertEqual(s.check(rule="nope", key="x").status, 404)
        self.assertEqual(s.check(rule="api", key="x", cost=6).status, 400)

    def test_only_enabled_false(self):
        s = self.start("[ratelimit]\nenabled = false\n")
        self.assertEqual(s.check(key="x").status, 404)


class Cli(SluicedTest):
    def run_cli(self, *args):
        return subprocess.run([SLUICED, *args], capture_output=True, text=True, timeout=30)

    def test_version_help(self):
        r = self.run_cli("--version")
        self.assertEqual(r.returncode, 0)
        self.assertRegex(r.stdout, r"sluiced \d+\.\d+\.\d+")
        r = self.run_cli("--help")
        self.assertEqual(r.returncode, 0)
        for opt in ("--config", "--listen", "--check-config", "--version"):
            self.assertIn(opt, r.stdout)

    def test_check_config(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "c.toml")
            with open(path, "w") as f:
                f.write(SEED)
            r = self.run_cli("--check-config", "--config", path)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout, "%s: ok (1 rules, 0 overrides, backend memory)\n" % path,
                             "the line `sluice config check` prints too")
            cases = [
                (SEED + "bogus = 1\n", "%s:8:1: unknown key 'bogus'" % path),
                (SEED.replace("limit = 100 ", "limit = \"many\""), "%s:7:9: limit must be an integer" % path),
                (SEED.replace("limit = 100 ", "limit = 0"), "%s:7:9: limit must be between 1" % path),
                (SEED.replace("window = 60 ", "window = \"60 s\""), "%s:6:10: window must be a duration" % path),
                (SEED.replace("limit = 100 ", "#"), "%s:1:1: [ratelimit] is missing 'limit'" % path),
                ("[ratelimit\n", "%s:1:11:" % path),
                ('[backend]\ntype = "redis_cluster"\ndatabase = 2\n' + SEED, "database must be 0 for a Redis Cluster"),
            ]
            for text, expected in cases:
                with open(path, "w") as f:
                    f.write(text)
                r = self.run_cli("--check-config", "--config", path)
                self.assertEqual(r.returncode, 1, text)
                self.assertIn(expected, r.stderr, text)
            r = self.run_cli("--check-config", "--config", os.path.join(d, "missing.toml"))
            self.assertEqual(r.returncode, 1)
            self.assertIn("missing.toml", r.stderr)

    def test_bad_config_at_start_exits_1(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "c.toml")
            with open(path, "w") as f:
                f.write("[[rules]]\nname = \"x\"\n")
            r = subprocess.run([SLUICED, "--config", path, "--listen", "127.0.0.1:0"], capture_output=True, text=True,
                               timeout=30)
            self.assertEqual(r.returncode, 1)
            self.assertIn("event=config_invalid", r.stderr)
            self.assertIn("c.toml:1:1: [[rules]] is missing 'algorithm'", r.stderr)


class Reload(SluicedTest):
    def test_sighup_keeps_state_unless_algorithm_or_window_change(self):
        s = self.start(FULL)
        self.assertEqual(s.check(rule="api", key="r:1", cost=2).json()["remaining"], 3)
        self.assertEqual(s.check(rule="ai", key="r:1").json()["remaining"], 2)
        self.assertEqual(s.check(rule="counter", key="r:1", cost=2).json()["remaining"], 0)
        self.assertEqual(s.check(rule="tenant_api", tenant="t", user="u").json()["remaining"], 1)
        new = FULL.replace("tenant_limit = 3\nuser_limit = 2", "tenant_limit = 3\nuser_limit = 1")
        new = new.replace("\nlimit = 3\n", "\nlimit = 10\n") + '\n[[rules]]\nname = "new"\nalgorithm = "fixed_window"\nlimit = 1\nwindow = 60\n'
        new = new.replace('name = "quota"', 'name = "quota2"').replace('window = "5m"', 'window = "10m"')
        line = s.reload(new)
        self.assertIn("event=reload result=success trigger=sighup", line)
        r = s.check(rule="api", key="r:1")
        self.assertEqual(r.json()["remaining"], 2, "an unchanged rule keeps its state")
        r = s.check(rule="ai", key="r:1")
        self.assertEqual(r.json()["limit"], 10)
        self.assertEqual(r.json()["remaining"], 8, "a raised limit keeps what the key used")
        r = s.check(rule="tenant_api", tenant="t", user="u")
        self.assertEqual(r.status, 429, "a lowered limit forgives nothing")
        self.assertEqual(r.json()["rejected_by"], "user")
        r = s.check(rule="counter", key="r:1")
        self.assertEqual(r.json()["remaining"], 1, "a new window starts afresh")
        self.assertEqual(s.check(rule="new", key="r:1").status, 200)
        self.assertEqual(s.check(rule="new", key="r:1").status, 429)
        self.assertEqual(s.check(rule="quota", key="r:1").status, 404, "a removed rule is gone")
        self.assertEqual(s.check(rule="quota2", key="r:1").status, 200)

    def test_invalid_file_keeps_running_config(self):
        s = self.start(FULL)
        self.assertEqual(s.check(rule="api", key="inv").json()["remaining"], 4)
        line = s.reload(FULL.replace("burst = 5", "burst = -5"))
        self.assertIn("event=reload result=failure", line)
        self.assertRegex(line, r"sluice\.toml:\d+:\d+: burst must be between 1")
        r = s.check(rule="api", key="inv")
        self.assertEqual(r.status, 200)
        self.assertEqual(r.json()["remaining"], 3, "the running config and its state are kept")
        line = s.reload("this is [ not toml")
        self.assertIn("event=reload result=failure", line)
        text = s.request("GET", "/metrics").body.decode()
        self.assertIn('sluice_config_reloads_total{result="failure"} 2', text)
        self.assertIn('sluice_config_reloads_total{result="success"} 0', text)
        self.assertEqual(s.check(rule="api", key="inv").json()["remaining"], 2)

    def test_file_change_reloads_without_signal(self):
        s = self.start(FULL.replace("[server]\n", "[server]\nwatch_interval_ms = 100\n"))
        self.assertEqual(s.check(rule="added", key="x").status, 404)
        new = FULL.replace("[server]\n", "[server]\nwatch_interval_ms = 100\n") + \
            '\n[[rules]]\nname = "added"\nalgorithm = "sliding_window"\nlimit = 7\nwindow = "250ms"\n'
        line = s.reload(new, trigger="file")
        self.assertIn("event=reload result=success trigger=file_change", line)
        r = s.check(rule="added", key="x")
        self.assertEqual(r.status, 200)
        self.assertEqual(r.json()["limit"], 7)
        text = s.request("GET", "/metrics").body.decode()
        self.assertIn('sluice_config_reloads_total{result="success"} 1', text)

    def test_disable_by_reload(self):
        s = self.start(SEED)
        for _ in range(100):
            s.check(key="z")
        self.assertEqual(s.check(key="z").status, 429)
        s.reload(SEED.replace("enabled = true", "enabled = false"))
        r = s.check(key="z")
        self.assertEqual(r.status, 200)
        self.assertEqual(r.json()["source"], "disabled")
        s.reload(SEED)
        self.assertEqual(s.check(key="z").status, 429, "re-enabling finds the unchanged rule's state")


class Shutdown(SluicedTest):
    def test_sigterm_exits_zero(self):
        s = Sluiced(FULL)
        try:
            self.assertEqual(s.check(rule="api", key="t").status, 200)
            # An open idle keep-alive connection must not hold the exit up.
            rc = s.stop(signal.SIGTERM, timeout=15)
            self.assertEqual(rc, 0, s.log_text())
            self.assertIn("event=drained", s.log_text())
        finally:
            s.close()

    def test_sigterm_while_requests_are_in_flight(self):
        s = Sluiced(FULL)
        try:
            socks = []
            body = json.dumps({"rule": "ai", "key": "inflight"}).encode()
            req = b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
            for _ in range(5):
                c = socket.create_connection(("127.0.0.1", s.port), timeout=5)
                c.sendall(req)  # headers only: the request is in flight until the body arrives
                socks.append(c)
            # Wait until sluiced counts the five (plus the scrape itself) as in flight.
            wait_for(lambda: re.search(r"sluice_http_requests_in_flight ([0-9]+)",
                                       s.request("GET", "/metrics").body.decode()).group(1) == "6",
                     timeout=10, what="five requests in flight")
            s.stop_conn()
            s.send_signal(signal.SIGTERM)
            time.sleep(0.2)
            self.assertIsNone(s.proc.poll(), "sluiced waits for the in-flight requests")
            for c in socks:
                c.sendall(body)
                data = c.recv(4096)
                self.assertTrue(data.startswith(b"HTTP/1.1 "), data)
                c.close()
            self.assertEqual(s.proc.wait(timeout=15), 0)
        finally:
            s.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)
