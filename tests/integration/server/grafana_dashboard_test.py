# SPDX-License-Identifier: Apache-2.0
"""The Grafana dashboard (packaging/grafana/sluiced-dashboard.json) asks only for what sluiced
exports: every metric name in its queries is a family in a real sluiced's /metrics, and every label
it groups by is on that family's samples (but `instance` and `job`, which Prometheus adds); its
instance and job variables come from a family every instance exports from its start."""

import json
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sluiced_harness import Sluiced  # noqa: E402

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


def queries(dashboard):
    for p in dashboard["panels"]:
        for t in p.get("targets", []):
            yield p["title"], t["expr"]


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
        text = s.request("GET", "/metrics").body.decode() + off.request("GET", "/metrics").body.decode()
        families = dict(re.findall(r"^# TYPE (\w+) (\w+)$", text, re.M))
        labels = {}
        for name, body in re.findall(r"^((?:sluice|process)_\w+)\{([^}]*)\}", text, re.M):
            labels.setdefault(name, set()).update(re.findall(r"(\w+)=\"", body))
        checked = 0
        for title, expr in queries(dashboard):
            for name in re.findall(r"\b(?:sluice|process)_\w+", expr):
                family = re.sub(r"_(bucket|sum|count)$", "", name) if name not in families else name
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


if __name__ == "__main__":
    unittest.main(verbosity=2)
