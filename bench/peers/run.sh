#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# make bench-peers: the core benchmarks next to Go's golang.org/x/time/rate, in one run, on this
# machine. Needs Debian's golang-go and golang-golang-x-time-dev (installed here when missing).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
"$root/scripts/deps" --peers
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

ours=$work/ours.json
"$root/build/bench/core_benchmark" --benchmark_min_time=0.5 --benchmark_format=json \
  --benchmark_filter='TokenBucket_(TryAcquireNowPassedIn|Refused|TryAcquireSteadyClock)$|Clock_SteadyClockNow|KeyedTokenBucket' \
  >"$ours"
(cd "$root/bench/peers" && GO111MODULE=off GOPATH=/usr/share/gocode GOCACHE="$work/gocache" \
  go test -run '^$' -bench . -benchtime 1s) >"$work/theirs.txt"

python3 - "$ours" "$work/theirs.txt" <<'PY'
import json, re, sys
ours = {b["name"]: b["real_time"] for b in json.load(open(sys.argv[1]))["benchmarks"]}
theirs = {}
for line in open(sys.argv[2]):
    m = re.match(r"Benchmark(\S+?)(-\d+)?\s+\d+\s+([\d.]+) ns/op", line)
    if m:
        theirs[m.group(1)] = float(m.group(3))
pairs = [
    ("try-acquire, now passed in", "BM_TokenBucket_TryAcquireNowPassedIn", "AllowNowPassedIn"),
    ("refused", "BM_TokenBucket_Refused", "AllowRefused"),
    ("try-acquire, clock read inside", "BM_TokenBucket_TryAcquireSteadyClock", "AllowClockRead"),
    ("clock read", "BM_Clock_SteadyClockNow", "TimeNow"),
    ("keyed, 100,000 keys, random", "BM_KeyedTokenBucket_RandomKeys/100000", "Keyed100k"),
    ("keyed, 1,000,000 keys, random", "BM_KeyedTokenBucket_RandomKeys/1000000", "Keyed1M"),
]
print(f"{'case':34} {'sluice ns/op':>13} {'x/time/rate ns/op':>18} {'ratio':>7}")
for label, o, t in pairs:
    if o in ours and t in theirs:
        print(f"{label:34} {ours[o]:13.1f} {theirs[t]:18.1f} {theirs[t] / ours[o]:6.1f}x")
PY
