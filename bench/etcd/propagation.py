# SPDX-License-Identifier: Apache-2.0
"""Time from a put in etcd to the new limit being in force on every sluiced watching it.

Puts `rules/bench` with a new burst through etcd's JSON gateway, then polls GET /v1/rules on each
instance (every 2 ms) until it shows that burst. Prints p50 / p99 / max per instance and overall.

  python3 propagation.py ETCD_PORT SLUICED_PORT [SLUICED_PORT...] [--changes 100]
"""

import argparse
import base64
import http.client
import json
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("etcd_port", type=int)
    ap.add_argument("sluiced_ports", type=int, nargs="+")
    ap.add_argument("--changes", type=int, default=100)
    a = ap.parse_args()
    etcd = http.client.HTTPConnection("127.0.0.1", a.etcd_port, timeout=10)
    instances = [http.client.HTTPConnection("127.0.0.1", p, timeout=10) for p in a.sluiced_ports]
    key = base64.b64encode(b"/sluice/rules/bench").decode()

    def burst_on(conn):
        conn.request("GET", "/v1/rules")
        for r in json.loads(conn.getresponse().read())["rules"]:
            if r["name"] == "bench":
                return r.get("burst")
        return None

    samples = [[] for _ in instances]
    for i in range(a.changes):
        burst = 1000 + i
        value = json.dumps({"algorithm": "token_bucket", "rate": 100, "burst": burst})
        body = json.dumps({"key": key, "value": base64.b64encode(value.encode()).decode()})
        start = time.monotonic()
        etcd.request("POST", "/v3/kv/put", body, {"Content-Type": "application/json"})
        assert etcd.getresponse().read() is not None
        pending = set(range(len(instances)))
        while pending:
            for n in list(pending):
                if burst_on(instances[n]) == burst:
                    samples[n].append(time.monotonic() - start)
                    pending.discard(n)
            if time.monotonic() - start > 10:
                raise SystemExit("change %d not seen within 10 s" % i)
            time.sleep(0.002)

    def line(name, xs):
        xs = sorted(xs)
        q = lambda p: xs[min(len(xs) - 1, int(p * len(xs)))] * 1000
        print("%-12s n=%-4d p50 %6.1f ms   p99 %6.1f ms   max %6.1f ms" % (name, len(xs), q(0.5), q(0.99), xs[-1] * 1000))

    for n, xs in enumerate(samples):
        line("instance %d" % (n + 1), xs)
    line("all", [x for xs in samples for x in xs])


if __name__ == "__main__":
    main()
