#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""End-to-end tests of sluiced on a real Redis Cluster (3 masters + 3 replicas started here): two
sluiced processes with four threads each share limits exactly on keys spread over every master;
/readyz and /metrics follow the cluster through a killed master's failover.

Usage: SLUICED=/path/to/sluiced python3 sluiced_redis_cluster_test.py
Exits 77 (skipped) when sluiced was built without Redis support.
"""

import os
import sys
import threading
import time
import unittest

sys.dont_write_bytecode = True  # keep the source tree clean
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sluiced_harness import Sluiced, RedisCluster, wait_for  # noqa: E402
from sluiced_redis_test import built_with_redis  # noqa: E402

LIMIT = 20
KEYS = ["user:%d" % i for i in range(24)]


def cluster_config(seeds, on_error="allow"):
    return """[backend]
type = "redis_cluster"
addresses = [%s]
timeout_ms = 1000
on_error = "%s"

[[rules]]
name = "shared"
algorithm = "sliding_window"
limit = %d
window = "60s"

[[rules]]
name = "tenant_api"
algorithm = "fixed_window"
window = "60s"
tenant_limit = 3
user_limit = 2
""" % (", ".join('"%s"' % s for s in seeds), on_error, LIMIT)


class SharedLimitsOnACluster(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = RedisCluster()

    @classmethod
    def tearDownClass(cls):
        cls.cluster.close()

    def test_two_instances_four_threads_each_admit_exactly_the_limit_of_every_key(self):
        a = Sluiced(cluster_config(self.cluster.seeds))
        self.addCleanup(a.close)
        b = Sluiced(cluster_config(self.cluster.seeds))
        self.addCleanup(b.close)
        admitted = {k: 0 for k in KEYS}
        sources = set()
        lock = threading.Lock()

        def worker(instance, offset):
            s = instance.client()
            try:
                for round_ in range(LIMIT + 10):
                    for i in range(len(KEYS)):
                        key = KEYS[(i + offset + round_) % len(KEYS)]
                        r = s.check(rule="shared", key=key)
                        self.assertIn(r.status, (200, 429))
                        with lock:
                            admitted[key] += r.status == 200
                            sources.add(r.json().get("source", "redis"))
            finally:
                s.stop_conn()

        threads = [threading.Thread(target=worker, args=(inst, n)) for n, inst in enumerate((a, b) * 4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(sources, {"redis"}, "every decision comes from the cluster")
        self.assertEqual(admitted, {k: LIMIT for k in KEYS})
        # The keys live on every master.
        masters = self.cluster.masters()
        self.assertEqual(len(masters), 3)
        for m in masters:
            self.assertGreater(int(m.cli("DBSIZE")), 0, m.address)
        metrics = a.request("GET", "/metrics").body.decode()
        self.assertIn("sluice_redis_cluster_masters 3", metrics)

    def test_dual_layer_is_all_or_nothing_across_instances(self):
        a = Sluiced(cluster_config(self.cluster.seeds))
        self.addCleanup(a.close)
        b = Sluiced(cluster_config(self.cluster.seeds))
        self.addCleanup(b.close)
        for tenant in ("acme", "{globex}", "%7B", "}{"):
            self.assertEqual(a.check(rule="tenant_api", tenant=tenant, user="u1").status, 200)
            self.assertEqual(b.check(rule="tenant_api", tenant=tenant, user="u1").status, 200)
            r = a.check(rule="tenant_api", tenant=tenant, user="u1")
            self.assertEqual(r.json()["rejected_by"], "user", tenant)
            self.assertEqual(b.check(rule="tenant_api", tenant=tenant, user="u2").status, 200)
            r = a.check(rule="tenant_api", tenant=tenant, user="u3")
            self.assertEqual(r.json()["rejected_by"], "tenant", tenant)


class FailoverOfAKilledMaster(unittest.TestCase):
    def test_readyz_and_decisions_follow_the_failover(self):
        cluster = RedisCluster()
        self.addCleanup(cluster.close)
        s = Sluiced(cluster_config(cluster.seeds, on_error="deny"))
        self.addCleanup(s.close)
        wait_for(lambda: s.request("GET", "/readyz").status == 200, what="sluiced ready")
        victim = cluster.master_of_key("sluice:{shared:user%3A1}:swl.60000000")
        heir = cluster.replica_of(victim)
        self.assertNotIn("source", s.check(rule="shared", key="user:1").json())
        killed = time.monotonic()
        victim.kill()
        wait_for(lambda: s.request("GET", "/readyz").status == 503, timeout=5, what="not ready")
        # Until the replica takes over, on_error decides; then the cluster again, without a restart.
        wait_for(lambda: "source" not in s.check(rule="shared", key="user:1").json(), timeout=30,
                 interval=0.05, what="the promoted replica to answer")
        gap = time.monotonic() - killed
        self.assertIn("role:master", heir.cli("INFO", "replication"))
        wait_for(lambda: s.request("GET", "/readyz").status == 200, timeout=5, what="ready again")
        print("failover gap through sluiced: %.2f s (cluster-node-timeout %d ms)"
              % (gap, RedisCluster.NODE_TIMEOUT_MS), file=sys.stderr)
        for _ in range(20):
            self.assertNotIn("source", s.check(rule="shared", key="user:1").json())


if __name__ == "__main__":
    if not built_with_redis():
        print("sluiced was built without Redis support: skipped")
        sys.exit(77)
    unittest.main()
