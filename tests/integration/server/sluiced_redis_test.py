#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""End-to-end tests of sluiced on a real redis-server: two sluiced processes share one limit exactly;
Redis killed -> each on_error policy and /readyz 503; Redis back -> recovery. And on a fake Redis
that misbehaves on purpose: a reply nobody asked for, malformed script replies.

Usage: SLUICED=/path/to/sluiced python3 sluiced_redis_test.py
Exits 77 (skipped) when sluiced was built without Redis support.
"""

import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import unittest

sys.dont_write_bytecode = True  # keep the source tree clean
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sluiced_harness import Sluiced, RedisServer, wait_for, SLUICED  # noqa: E402


def redis_config(port, on_error="allow", prefix="sluice:"):
    return """[server]
admin_token = "redis-admin-token-0123"

[backend]
type = "redis"
addresses = ["127.0.0.1:%d"]
key_prefix = "%s"
timeout_ms = 100
on_error = "%s"

[[rules]]
name = "shared"
algorithm = "sliding_window"
limit = 100
window = "60s"

[[rules]]
name = "bucket"
algorithm = "token_bucket"
rate = 0.01
burst = 5

[[rules]]
name = "tenant_api"
algorithm = "sliding_window"
window = "60s"
tenant_limit = 3
user_limit = 2
""" % (port, prefix, on_error)


def checks_in_parallel(instances, n, admitted, **fields):
    """One thread per entry of `instances`, each on its own keep-alive connection, making `n`
    checks of `fields`; returns each thread's count of responses for which `admitted` is true."""
    counts = []
    lock = threading.Lock()

    def worker(instance):
        s = Sluiced.__new__(Sluiced)
        s.port, s.conn = instance.port, None
        count = sum(bool(admitted(Sluiced.check(s, **fields))) for _ in range(n))
        if s.conn:
            s.conn.close()
        with lock:
            counts.append(count)

    threads = [threading.Thread(target=worker, args=(inst,)) for inst in instances]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return counts


def built_with_redis():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "c.toml")
        with open(path, "w") as f:
            f.write(redis_config(6379))
        r = subprocess.run([SLUICED, "--check-config", "--config", path], capture_output=True, text=True, timeout=30)
        return r.returncode == 0


class SharedLimit(unittest.TestCase):
    def setUp(self):
        self.redis = RedisServer()
        self.addCleanup(self.redis.close)

    def test_two_instances_share_one_limit_exactly(self):
        a = Sluiced(redis_config(self.redis.port))
        self.addCleanup(a.close)
        b = Sluiced(redis_config(self.redis.port))
        self.addCleanup(b.close)
        def admitted(r):
            self.assertIn(r.status, (200, 429))
            self.assertNotIn("source", r.json(), "every decision comes from Redis")
            return r.status == 200

        admitted = checks_in_parallel((a, b, a, b), 75, admitted, rule="shared", key="user:shared")
        self.assertEqual(sum(admitted), 100, admitted)
        self.assertEqual(len(admitted), 4)
        # Both instances see the same exhausted window, with the same headers.
        for s in (a, b):
            r = s.check(rule="shared", key="user:shared")
            self.assertEqual(r.status, 429)
            self.assertEqual(r.headers["x-ratelimit-remaining"], "0")
            self.assertGreaterEqual(int(r.headers["retry-after"]), 1)

    def test_a_leased_rule_never_exceeds_its_limit_and_costs_fewer_calls(self):
        # A 1 h window: a run crossing into the next one (a chance of about 1 in 2,000) could admit
        # the next window's units too.
        leased = redis_config(self.redis.port) + """
[[rules]]
name = "leased"
algorithm = "fixed_window"
limit = 200
window = "1h"
lease = "200ms"
lease_max_share = 0.1
"""
        a = Sluiced(leased)
        self.addCleanup(a.close)
        b = Sluiced(leased)
        self.addCleanup(b.close)
        admitted = checks_in_parallel((a, b, a, b), 150, lambda r: r.status == 200, rule="leased", key="hot")
        # At most the limit; at least the limit less what the two instances can hold (20 each).
        self.assertLessEqual(sum(admitted), 200, admitted)
        self.assertGreaterEqual(sum(admitted), 200 - 2 * 20, admitted)
        metrics = a.request("GET", "/metrics").body.decode()
        self.assertIn('sluice_lease_checks_total{rule="leased"} 300', metrics)
        calls = [line for line in metrics.splitlines() if line.startswith('sluice_lease_redis_calls_total{rule="leased"}')]
        self.assertEqual(len(calls), 1, metrics)
        self.assertLess(int(calls[0].split()[-1]), 100, "leases and remembered refusals: far fewer calls than checks")

    def test_dual_layer_and_token_bucket_over_redis(self):
        a = Sluiced(redis_config(self.redis.port))
        self.addCleanup(a.close)
        b = Sluiced(redis_config(self.redis.port))
        self.addCleanup(b.close)
        self.assertEqual(a.check(rule="tenant_api", tenant="t", user="u1").status, 200)
        self.assertEqual(b.check(rule="tenant_api", tenant="t", user="u1").status, 200)
        r = a.check(rule="tenant_api", tenant="t", user="u1")
        self.assertEqual(r.status, 429)
        self.assertEqual(r.json()["rejected_by"], "user")
        self.assertEqual(b.check(rule="tenant_api", tenant="t", user="u2").status, 200)
        r = a.check(rule="tenant_api", tenant="t", user="u3")
        self.assertEqual(r.json()["rejected_by"], "tenant")
        self.assertEqual(a.check(rule="bucket", key="k", cost=3).json()["remaining"], 2)
        self.assertEqual(b.check(rule="bucket", key="k", cost=2).json()["remaining"], 0)
        self.assertEqual(a.check(rule="bucket", key="k").status, 429)
        # A look answers from Redis and takes nothing.
        r = b.check(rule="bucket", key="k", cost=0)
        self.assertEqual((r.status, r.json()["remaining"]), (429, 0))
        self.assertEqual(a.check(rule="bucket", key="look", cost=0).json()["remaining"], 5)
        self.assertEqual(a.check(rule="bucket", key="look", cost=5).json()["remaining"], 0)
        # A reset on one instance is seen by the other; with Redis down it fails, whatever on_error says.
        self.assertEqual(a.reset("redis-admin-token-0123", rule="bucket", key="k").status, 200)
        self.assertEqual(b.check(rule="bucket", key="k", cost=0).json()["remaining"], 5)
        # A bad request does not reach Redis.
        self.assertEqual(a.check(rule="bucket", key="k", cost=-1).status, 400)


class RedisOutOfMemory(unittest.TestCase):
    def test_readyz_follows_redis_memory(self):
        redis = RedisServer()
        self.addCleanup(redis.close)
        s = Sluiced(redis_config(redis.port))
        self.addCleanup(s.close)
        # Ready once its connection to Redis is up (sluiced answers /healthz before that).
        wait_for(lambda: s.request("GET", "/readyz").status == 200, what="sluiced ready")
        redis.cli("SET", "filler", last_arg="x" * (3 << 20))
        redis.cli("CONFIG", "SET", "maxmemory", "1mb")
        for i in range(20):
            r = s.check(rule="shared", key="k%d" % i)
            self.assertEqual(r.json().get("source"), "fail_open", "Redis refuses the script: on_error decides")
        self.assertEqual(redis.cli("DBSIZE"), "1", "no script wrote past maxmemory")
        self.assertEqual(s.request("GET", "/readyz").status, 503)
        redis.cli("CONFIG", "SET", "maxmemory", "0")
        wait_for(lambda: s.request("GET", "/readyz").status == 200, timeout=5, what="readiness to return")


class RedisFailure(unittest.TestCase):
    def test_on_error_policies_readiness_and_recovery(self):
        redis = RedisServer()
        self.addCleanup(redis.close)
        allow = Sluiced(redis_config(redis.port, "allow"))
        self.addCleanup(allow.close)
        deny = Sluiced(redis_config(redis.port, "deny"))
        self.addCleanup(deny.close)
        local = Sluiced(redis_config(redis.port, "local"))
        self.addCleanup(local.close)
        for s in (allow, deny, local):
            # Ready once its connection to Redis is up (sluiced listens before that; on a loaded
            # machine the handshake may still be under way).
            wait_for(lambda: s.request("GET", "/readyz").status == 200, what="sluiced ready")
            self.assertEqual(s.check(rule="bucket", key="before").status, 200)

        redis.kill()
        for s in (allow, deny, local):
            wait_for(lambda: s.request("GET", "/readyz").status == 503, timeout=10, what="/readyz 503")
            self.assertEqual(s.request("GET", "/healthz").status, 200, "alive even when not ready")

        r = allow.check(rule="bucket", key="down")
        self.assertEqual(r.status, 200)
        self.assertEqual(r.json()["source"], "fail_open")
        r = deny.check(rule="bucket", key="down")
        self.assertEqual(r.status, 429)
        self.assertEqual(r.json()["source"], "fail_closed")
        self.assertIn("retry-after", r.headers)
        # on_error = local: an in-process limiter of the same rule decides (burst 5).
        statuses = [local.check(rule="bucket", key="down").status for _ in range(6)]
        self.assertEqual(statuses, [200] * 5 + [429])
        self.assertEqual(local.check(rule="bucket", key="down2").json()["source"], "local_fallback")
        # A reset is never assumed: 503 whatever on_error says.
        for s in (allow, local):
            r = s.reset("redis-admin-token-0123", rule="bucket", key="down")
            self.assertEqual((r.status, r.json()["error"]["code"]), (503, "backend_unavailable"))
        text = allow.request("GET", "/metrics").body.decode()
        self.assertRegex(text, r"sluice_fail_open_total [1-9]")
        self.assertIn("sluice_backend_ready 0", text)
        self.assertIn("sluice_redis_circuit_open 1", text)
        self.assertRegex(text, r"sluice_redis_unavailable_total [1-9]")

        redis.start()
        for s in (allow, deny, local):
            wait_for(lambda: s.request("GET", "/readyz").status == 200, timeout=15, what="/readyz 200 again")

        def decided_by_redis(s):
            r = s.check(rule="shared", key="after")
            return r.status == 200 and "source" not in r.json()

        for s in (allow, deny, local):
            wait_for(lambda: decided_by_redis(s), timeout=10, what="Redis to decide again")
        # The restarted Redis is empty: the three instances now share one fresh window.
        r = allow.check(rule="shared", key="after")
        self.assertEqual(r.json()["remaining"], 100 - 4)


class FakeRedis:
    """Not Redis: on 127.0.0.1, answers every command +OK (PING +PONG) and every script call with
    `script_reply`, which a test may change; each connection on its own thread (sluiced has one
    per io thread), until closed."""

    def __init__(self, script_reply):
        self.script_reply = script_reply
        self.lock = threading.Lock()
        self.connections = 0
        self.script_calls = 0
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(4)
        self.port = self.listener.getsockname()[1]
        self.stopping = False
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def readable(self, sock):
        while not self.stopping:
            if select.select([sock], [], [], 0.02)[0]:
                return True
        return False

    def serve(self):
        handlers = []
        while self.readable(self.listener):
            conn, _ = self.listener.accept()
            with self.lock:
                self.connections += 1
            handlers.append(threading.Thread(target=self.answer, args=(conn,), daemon=True))
            handlers[-1].start()
        for h in handlers:
            h.join()

    def answer(self, conn):
        data = b""
        with conn:
            while self.readable(conn):
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
                out = b""
                while True:
                    name, data = self.next_command(data)
                    if name is None:
                        break
                    if name in (b"EVALSHA", b"EVAL"):
                        with self.lock:
                            self.script_calls += 1
                        out += self.script_reply
                    else:
                        out += b"+PONG\r\n" if name == b"PING" else b"+OK\r\n"
                try:
                    conn.sendall(out)
                except OSError:
                    break

    @staticmethod
    def next_command(data):
        """The name of the first whole RESP command in `data`, and what follows it; None until whole."""
        lines = data.split(b"\r\n", 1)
        if len(lines) < 2 or not data.startswith(b"*"):
            return None, data
        argc, rest = int(lines[0][1:]), lines[1]
        name = None
        for _ in range(argc):
            head = rest.split(b"\r\n", 1)
            if len(head) < 2:
                return None, data
            length = int(head[0][1:])
            if len(head[1]) < length + 2:
                return None, data
            name = name or head[1][:length]
            rest = head[1][length + 2:]
        return name, rest

    def close(self):
        self.stopping = True
        self.thread.join()
        self.listener.close()


# A valid reply of the "shared" rule's script: admitted, 99 left.
ADMITTED = b"*5\r\n:1\r\n:99\r\n:0\r\n:60000000\r\n:1700000000000000\r\n"


class MisbehavingRedis(unittest.TestCase):
    def start(self, script_reply):
        fake = FakeRedis(script_reply)
        self.addCleanup(fake.close)
        s = Sluiced(redis_config(fake.port, "deny"))
        self.addCleanup(s.close)
        wait_for(lambda: s.request("GET", "/readyz").status == 200, what="sluiced ready")
        return fake, s

    def test_a_reply_nobody_asked_for_drops_the_connection_not_the_process(self):
        fake, s = self.start(ADMITTED + b"+OK\r\n")
        sources = set()
        first = fake.connections

        def reconnected():
            sources.add(s.check(rule="shared", key="k").json().get("source", "redis"))
            return fake.connections >= first + 2

        wait_for(reconnected, timeout=20, what="the connection to be dropped and made again twice")
        self.assertIsNone(s.proc.poll(), "sluiced is alive")
        self.assertEqual(s.request("GET", "/healthz").status, 200)
        self.assertIn("redis", sources, "the reply asked for decided its check")
        self.assertIn("dropped: a reply came with no command waiting", s.log_text())

    def test_readyz_503_while_every_script_reply_is_malformed_then_200_again(self):
        fake, s = self.start(b":1\r\n")

        def not_ready():
            r = s.check(rule="shared", key="k")
            self.assertEqual(r.json()["source"], "fail_closed", "on_error decides")
            return s.request("GET", "/readyz").status == 503

        wait_for(not_ready, timeout=10, what="/readyz 503")
        self.assertIn("unexpected reply from the rate-limit script", s.log_text())
        fake.script_reply = ADMITTED

        def decided_by_redis():
            return "source" not in s.check(rule="shared", key="k").json() and s.request("GET", "/readyz").status == 200

        wait_for(decided_by_redis, timeout=10, what="Redis to decide and /readyz 200 again")


if __name__ == "__main__":
    if not built_with_redis():
        print("sluiced was built without Redis support: skipped")
        sys.exit(77)
    unittest.main(verbosity=2)
