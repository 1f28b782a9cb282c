# SPDX-License-Identifier: Apache-2.0
"""The Grafana dashboard (packaging/grafana/sluiced-dashboard.json) shows every metric family a real
sluiced exports, on the in-process backend and on Redis with a leased rule and Envoy's API, and asks
only for what sluiced exports: every metric name in its queries is a family of those /metrics (but
the Cluster's and Sentinel's, read from the source), and every label it groups by is on that
family's samples (but `instance` and `job`, which Prometheus adds). Its panels sit in one row per
part of sluiced, each has a unit, and none mixes per-second rates with counts on one axis. Its
instance and job variables come from a family every instance exports from its start."""

import json
import os
import re
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sluiced_harness import RedisServer, Sluiced  # noqa: E402

DASHBOARD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "packaging", "grafana",
                         "sluiced-dashboard.json")

CONFIG = """
[[rules]]
name = "api"
algorithm = "token_bucket"
rate = 0.001
burst = 1

[[rules]]
name = "tenant_api"
algorithm = "fixed_window"
window = "1h"
tenant_limit = 1
user_limit = 5
"""


ROWS = ["Decisions", "Latency", "Keys and evictions", "Redis and Cluster", "Leases", "Rules: file and etcd",
        "Envoy rate-limit API", "HTTP and process"]

ENVOY_YAML = """domain: edge
descriptors:
  - key: path
    rate_limit: {unit: second, requests_per_unit: 5}
"""


def queries(dashboard):
    for p in dashboard["panels"]:
        for t in p.get("targets", []):
            yield p["title"], t["expr"]


def redis_config(port, envoy_dir):
    return """[server]
grpc_listen = "127.0.0.1:0"
[envoy]
config_dir = "%s"
[backend]
type = "redis"
addresses = ["127.0.0.1:%d"]
[[rules]]
name = "leased"
algorithm = "fixed_window"
limit = 100
window = "60s"
lease = "100ms"
""" % (envoy_dir, port)


# Families only a Redis Cluster or a Sentinel-managed Redis exports: named in the backend's source.
def only_in_other_modes(name):
    with open(os.path.join(os.path.dirname(DASHBOARD), "..", "..", "src", "redis", "redis_backend.cpp")) as f:
        return re.match(r"sluice_redis_(cluster|sentinel)_", name) and ('"%s"' % name) in f.read()


class Dashboard(unittest.TestCase):
    def test_queries_reference_only_what_sluiced_exports(self):
        with open(DASHBOARD) as f:
            dashboard = json.load(f)
        s = Sluiced(CONFIG)
        self.addCleanup(s.close)
        # Samples for every family the dashboard groups: allowed, refused (both layers).
        s.check(rule="api", key="k")
        s.check(rule="api", key="k")
        s.check(rule="tenant_api", tenant="t", user="u")
        s.check(rule="tenant_api", tenant="t", user="v")
        # And decisions made without the limiter (limiting disabled): the failure-policy family.
        off = Sluiced("[ratelimit]\nenabled = false\n" + CONFIG)
        self.addCleanup(off.close)
        off.check(rule="api", key="k")
        # On Redis, with a leased rule and Envoy's API: the Redis, lease and gRPC families.
        redis = RedisServer()
        self.addCleanup(redis.close)
        envoy_dir = tempfile.TemporaryDirectory(prefix="sluiced-envoy-")
        self.addCleanup(envoy_dir.cleanup)
        with open(os.path.join(envoy_dir.name, "edge.yaml"), "w") as f:
            f.write(ENVOY_YAML)
        on_redis = Sluiced(redis_config(redis.port, envoy_dir.name))
        self.addCleanup(on_redis.close)
        on_redis.check(rule="leased", key="k")
        text = "".join(x.request("GET", "/metrics").body.decode() for x in (s, off, on_redis))
        families = dict(re.findall(r"^# TYPE (\w+) (\w+)$", text, re.M))
        labels = {}
        for name, body in re.findall(r"^((?:sluice|process)_\w+)\{([^}]*)\}", text, re.M):
            labels.setdefault(name, set()).update(re.findall(r"(\w+)=\"", body))
        checked = 0
        for title, expr in queries(dashboard):
            for name in re.findall(r"\b(?:sluice|process)_\w+", expr):
                family = re.sub(r"_(bucket|sum|count)$", "", name) if name not in families else name
                if not only_in_other_modes(family):
                    self.assertIn(family, families, "%s: %s is not exported" % (title, name))
                checked += 1
            for grouped, name in re.findall(r"by \(([\w, ]+)\) \((?:\w+\()?((?:sluice|process)_\w+)", expr):
                grouped = ", ".join(g for g in grouped.split(", ") if g != "instance")  # added by Prometheus
                if name not in labels:
                    continue  # no samples in this run (e.g. backend errors of a memory backend)
                for label in [g.strip() for g in grouped.split(",")]:
                    self.assertIn(label, labels[name], "%s: %s has no label %s" % (title, name, label))
        self.assertGreater(checked, 10)
        for variable in dashboard["templating"]["list"]:
            if variable["type"] == "query":
                self.assertIn("sluice_build_info", variable["definition"], variable["name"])
        self.assertIn("sluice_build_info", families)
        # Every family exported is on the dashboard.
        shown = " ".join(expr for _, expr in queries(dashboard))
        for family in families:
            self.assertRegex(shown, r"\b%s(_bucket)?\b" % family, "%s is exported but on no panel" % family)

    def test_rows_units_and_axes(self):
        with open(DASHBOARD) as f:
            dashboard = json.load(f)
        rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
        self.assertEqual(rows, ROWS)
        self.assertEqual(dashboard["panels"][0]["type"], "row", "every panel sits in a row")
        for p in dashboard["panels"]:
            if p["type"] == "row":
                continue
            unit = p["fieldConfig"]["defaults"].get("unit")
            self.assertTrue(unit, "%s has no unit" % p["title"])
            self.assertEqual(p["fieldConfig"]["overrides"], [], "%s: one unit for the panel" % p["title"])
            # One axis, one kind: all per-second rates (or ratios of them), or none.
            rates = {bool(re.search(r"\b(rate|increase)\(", t["expr"])) and "increase(" not in t["expr"]
                     for t in p["targets"]}
            self.assertEqual(len(rates), 1, "%s mixes rates with counts" % p["title"])
            if unit in ("reqps", "ops"):
                self.assertEqual(rates, {True}, "%s: %s but not a rate" % (p["title"], unit))


if __name__ == "__main__":
    unittest.main(verbosity=2)
