#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Rules from etcd: how fast a change reaches two sluiced, and what 1,000 overrides cost a check.
#
#   1. etcd (a throwaway member on free 127.0.0.1 ports) and two sluiced watching its prefix: the
#      time from a put to the new limit in force on both (p50/p99 over 100 changes);
#   2. wrk against sluiced (memory backend) with no overrides, then with 1,000 [[overrides]] on the
#      checked rule, twice each in turn, ids over 100,000 keys (1% of them overridden).
#
#   bench/etcd/run.sh [SLUICED]        # default: build/src/server/sluiced (a Release build)
#   DURATION=10s CONNECTIONS=64 CHANGES=100 bench/etcd/run.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
sluiced="${1:-$root/build/src/server/sluiced}"
duration="${DURATION:-10s}"
connections="${CONNECTIONS:-64}"
changes="${CHANGES:-100}"
[ -x "$sluiced" ] || { echo "no sluiced at $sluiced (build it first: make build)" >&2; exit 1; }
for tool in etcd wrk python3 curl; do
  command -v "$tool" >/dev/null || { echo "$tool is required (scripts/deps installs it)" >&2; exit 1; }
done

source "$here/../lib.sh"

rule='[[rules]]
name = "bench"
algorithm = "token_bucket"
rate = 100
burst = 100'

# --- 1. propagation ---------------------------------------------------------------------------
eport="$(free_port)"
pport="$(free_port)"
etcd --name bench --data-dir "$work/etcd" --log-level error \
  --listen-client-urls "http://127.0.0.1:$eport" --advertise-client-urls "http://127.0.0.1:$eport" \
  --listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
  --initial-cluster "bench=http://127.0.0.1:$pport" >/dev/null 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$eport/health" 20
ports=()
for n in 1 2; do
  port="$(free_port)"
  printf '[server]\nlisten = "127.0.0.1:%s"\nthreads = 1\n%s\n[etcd]\nendpoints = ["127.0.0.1:%s"]\n' \
    "$port" "$rule" "$eport" >"$work/sluiced-$n.toml"
  "$sluiced" --config "$work/sluiced-$n.toml" 2>"$work/sluiced-$n.log" &
  pids+=($!)
  wait_http "http://127.0.0.1:$port/healthz" 20
  ports+=("$port")
done
echo "put in etcd -> new limit in force on 2 sluiced ($changes changes, polled every 2 ms):"
python3 "$here/propagation.py" "$eport" "${ports[@]}" --changes "$changes"

# --- 2. checks with 1,000 overrides vs none ---------------------------------------------------------
overrides="$work/overrides.extra"
: >"$overrides"
for i in $(seq 0 999); do
  printf '[[overrides]]\nrule = "bench"\nkey = "user:%d"\nrate = 200\nburst = 200\n' "$((i * 100))" >>"$overrides"
done
run() {  # run NAME EXTRA_TOML_FILE OVERRIDES: requests/s of one wrk run
  local port out
  port="$(free_port)"
  { printf '[server]\nlisten = "127.0.0.1:%s"\nthreads = 0\n%s\n' "$port" "$rule"; cat "$2"; } >"$work/$1.toml"
  "$sluiced" --config "$work/$1.toml" 2>"$work/$1.log" &
  local pid=$!
  wait_http "http://127.0.0.1:$port/healthz" 20
  out="$(RULE=bench wrk -t2 -c"$connections" -d"$duration" --latency -s "$root/bench/server/check.lua" "http://127.0.0.1:$port")"
  local in_force
  in_force="$(curl -s "http://127.0.0.1:$port/v1/rules" | python3 -c 'import json, sys; print(json.load(sys.stdin)["overrides"])')"
  [ "$in_force" = "$3" ] || { echo "$1: $in_force overrides in force, expected $3" >&2; exit 1; }
  kill "$pid"; wait "$pid" || true
  awk '/^Requests\/sec:/ {print $2}' <<<"$out"
}
: >"$work/none.extra"
echo
echo "wrk -t2 -c$connections -d$duration, POST /v1/check over 100,000 ids, $(nproc) cores:"
for round in 1 2; do
  none="$(run none "$work/none.extra" 0)"
  with="$(run overrides "$overrides" 1000)"
  awk -v r="$round" -v a="$none" -v b="$with" \
    'BEGIN { printf "round %d: no overrides %10.0f req/s   1,000 overrides %10.0f req/s   ratio %.3f\n", r, a, b, b / a }'
done
