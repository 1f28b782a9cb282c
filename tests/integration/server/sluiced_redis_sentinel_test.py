#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""End-to-end tests of sluiced on a Sentinel-managed master (a master, two replicas and three
sentinels started here): two sluiced processes under load follow a SENTINEL FAILOVER and a SIGKILL
of the master without a restart; /readyz and /metrics follow.

Usage: SLUICED=/path/to/sluiced python3 sluiced_redis_sentinel_test.py
Exits 77 (skipped) when sluiced was built without Redis support.
"""

import os
import sys
import threading
import time
import unittest

sys.dont_write_bytecode = True  # keep the source tree clean
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sluiced_harness import Sluiced, RedisSentinelGroup, wait_for  # noqa: E402
from sluiced_redis_test import built_with_redis  # noqa: E402


def sentinel_config(sentinels):
    return """[backend]
type = "redis_sentinel"
sentinels = [%s]
master_name = "%s"
timeout_ms = 500
on_error = "deny"
breaker_probe_interval_ms = 50

[[rules]]
name = "shared"
algorithm = "sliding_window"
limit = 100000000
window = "1h"
""" % (", ".join('"%s"' % s for s in sentinels), RedisSentinelGroup.MASTER_NAME)


class FollowsTheMaster(unittest.TestCase):
    def across_a_switch(self, make_switch):
        """Two sluiced check one key from two threads each while `make_switch(old_master)` moves the
        master; returns (checks refused by on_error, seconds until every instance's checks are
        decided by Redis again)."""
        group = RedisSentinelGroup()
        self.addCleanup(group.close)
        instances = [Sluiced(sentinel_config(group.sentinel_addresses)) for _ in range(2)]
        for s in instances:
            self.addCleanup(s.close)
            wait_for(lambda: s.request("GET", "/readyz").status == 200, what="sluiced ready")
        old = group.master()
        stop = threading.Event()
        failed = [0]
        wrong = []  # answers that are neither Redis's admission nor on_error's refusal
        lock = threading.Lock()

        def worker(instance):
            c = instance.client()
            deadline = time.monotonic() + 60
            try:
                while not stop.is_set() and time.monotonic() < deadline:
                    r = c.check(rule="shared", key="user:1")
                    source = r.json().get("source")
                    with lock:
                        failed[0] += source is not None
                        if (r.status, source) not in ((200, None), (429, "fail_closed")):
                            wrong.append((r.status, source))
            finally:
                c.stop_conn()

        threads = [threading.Thread(target=worker, args=(s,)) for s in instances * 2]
        for t in threads:
            t.start()
        time.sleep(0.3)  # load on the old master first
        started = time.monotonic()
        make_switch(group, old)
        try:
            wait_for(lambda: group.master() is not old, timeout=30, what="the sentinels to move the master")
            for s in instances:
                wait_for(lambda: "source" not in s.check(rule="shared", key="user:2").json(), timeout=30,
                         interval=0.05, what="checks decided by the new master")
            recovered = time.monotonic() - started
            time.sleep(0.3)  # load on the new master
        finally:
            stop.set()
            for t in threads:
                t.join()
        self.assertEqual(wrong, [])
        for s in instances:
            wait_for(lambda: s.request("GET", "/readyz").status == 200, timeout=10, what="ready again")
            metrics = s.request("GET", "/metrics").body.decode()
            switches = [l for l in metrics.splitlines() if l.startswith("sluice_redis_sentinel_master_switches_total ")]
            self.assertEqual(len(switches), 1, metrics)
            self.assertGreaterEqual(int(switches[0].split()[1]), 1)
        self.assertGreater(int(group.master().cli("DBSIZE")), 0)
        return failed[0], recovered

    def test_a_sentinel_failover(self):
        def failover(group, old):
            self.assertEqual(group.sentinels[1].cli("SENTINEL", "FAILOVER", RedisSentinelGroup.MASTER_NAME), "OK")

        failed, recovered = self.across_a_switch(failover)
        print("SENTINEL FAILOVER through sluiced: %d checks refused by on_error, decided again after %.2f s"
              % (failed, recovered), file=sys.stderr)

    def test_the_master_killed(self):
        failed, recovered = self.across_a_switch(lambda group, old: old.kill())
        print("master killed through sluiced: %d checks refused by on_error, decided again after %.2f s"
              % (failed, recovered), file=sys.stderr)


if __name__ == "__main__":
    if not built_with_redis():
        print("sluiced was built without Redis support: skipped")
        sys.exit(77)
    unittest.main()
