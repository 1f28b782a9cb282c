#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Leases vs exact checks vs the memory backend, same run, same load: two sluiced (on one
# redis-server for exact and lease mode), each loaded by its own wrk (CONNECTIONS connections, one
# per wrk thread), 90% of checks on 1,000 hot keys and 10% on 100,000 cold ones. Every key's rule:
# at most 300 per 10 s fixed window (the hot keys ask for more, the cold ones for far less).
# Prints checks/s and p99 of each mode, the Redis script runs and calls per check (hot and cold
# keys apart), and the most any hot key admitted in one window on both instances together.
#
#   bench/leases/run.sh [SLUICED]        # default: build/src/server/sluiced (a Release build)
#   DURATION=10s CONNECTIONS=32 bench/leases/run.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
sluiced="${1:-$root/build/src/server/sluiced}"
duration="${DURATION:-10s}"
connections="${CONNECTIONS:-32}"
limit=300
[ -x "$sluiced" ] || { echo "no sluiced at $sluiced (build it first: make build)" >&2; exit 1; }
for tool in wrk redis-server redis-cli python3 curl; do
  command -v "$tool" >/dev/null || { echo "$tool is required (scripts/deps installs it)" >&2; exit 1; }
done
source "$here/../lib.sh"

rport="$(free_port)"
start_redis "$rport" redis

rules() {  # rules MODE LEASE_LINE: MODE_hot and MODE_cold
  for kind in hot cold; do
    printf '[[rules]]\nname = "%s_%s"\nalgorithm = "fixed_window"\nlimit = %d\nwindow = "10s"\n%s\n\n' \
      "$1" "$kind" "$limit" "$2"
  done
}

config() {  # config MODE PORT
  printf '[server]\nlisten = "127.0.0.1:%s"\n' "$2"
  if [ "$1" = memory ]; then
    printf '[backend]\ntype = "memory"\n'
  else
    printf '[backend]\ntype = "redis"\naddresses = ["127.0.0.1:%s"]\ntimeout_ms = 200\n' "$rport"
  fi
  if [ "$1" = lease ]; then rules lease 'lease = "500ms"'; else rules "$1" ""; fi
}

metric() {  # metric FILE NAME_AND_LABELS: the sample's value, 0 when absent
  awk -v m="$2" '$1 == m { v = $2 } END { print v + 0 }' "$1"
}

results=()
run_mode() {  # run_mode MODE
  local mode="$1" ports=() started=()
  redis-cli -p "$rport" flushall >/dev/null
  for i in 1 2; do
    local port
    port="$(free_port)"
    config "$mode" "$port" >"$work/$mode-$i.toml"
    "$sluiced" --config "$work/$mode-$i.toml" 2>"$work/$mode-$i.log" &
    pids+=($!)
    started+=($!)
    ports+=("$port")
  done
  for port in "${ports[@]}"; do wait_http "http://127.0.0.1:$port/healthz"; done
  local wrks=()
  for i in 1 2; do
    RULE="$mode" OUT="$work/$mode-$i.counts" WINDOW=10 wrk -t"$connections" -c"$connections" -d"$duration" \
      --latency -s "$here/hot_cold.lua" "http://127.0.0.1:${ports[$((i - 1))]}" >"$work/$mode-$i.wrk" &
    wrks+=($!)
  done
  wait "${wrks[@]}"
  for i in 1 2; do curl -s "http://127.0.0.1:${ports[$((i - 1))]}/metrics" >"$work/$mode-$i.metrics"; done
  for pid in "${started[@]}"; do kill "$pid"; wait "$pid" || true; done

  local rps=0 p99="" checks_hot=0 checks_cold=0 calls_hot=0 calls_cold=0 calls=0 checks=0
  for i in 1 2; do
    rps="$(awk -v a="$rps" '/^Requests\/sec:/ {print a + $2}' "$work/$mode-$i.wrk")"
    p99="$p99 $(awk '$1 == "99%" {print $2}' "$work/$mode-$i.wrk")"
    local m="$work/$mode-$i.metrics"
    checks_hot=$((checks_hot + $(metric "$m" "sluice_lease_checks_total{rule=\"lease_hot\"}")))
    checks_cold=$((checks_cold + $(metric "$m" "sluice_lease_checks_total{rule=\"lease_cold\"}")))
    calls_hot=$((calls_hot + $(metric "$m" "sluice_lease_redis_calls_total{rule=\"lease_hot\"}")))
    calls_cold=$((calls_cold + $(metric "$m" "sluice_lease_redis_calls_total{rule=\"lease_cold\"}")))
    calls=$((calls + $(metric "$m" "sluice_redis_calls_total")))
    checks=$((checks + $(metric "$m" "sluice_redis_checks_total")))
    if [ "$(metric "$m" sluice_fail_open_total)" != 0 ]; then echo "warning: $mode: checks failed open" >&2; fi
  done
  # The most a hot key admitted in one window, on both instances together, and the windows over it.
  local most
  most="$(cat "$work/$mode-1.counts" "$work/$mode-2.counts" | python3 -c '
import sys, collections
n = collections.Counter()
for line in sys.stdin:
    key, window, count = line.split()
    n[key, window] += int(count)
over = sum(1 for v in n.values() if v > '"$limit"')
print("%d %d %d" % (max(n.values(), default=0), over, len(n)))')"
  results+=("$mode|$rps|$p99|$checks_hot|$checks_cold|$calls_hot|$calls_cold|$calls|$checks|$most")
}

run_mode memory
run_mode exact
run_mode lease

echo
echo "two sluiced, each under wrk -t$connections -c$connections -d$duration; 90% of checks on 1,000 hot keys,"
echo "10% on 100,000 cold ones; limit $limit per 10 s fixed window per key; $(nproc) cores"
printf '%-7s %11s %17s %15s %15s %12s %22s\n' mode "checks/s" "p99 (each sluiced)" "runs/check hot" "runs/check cold" \
  "calls/check" "hot key-window max"
for r in "${results[@]}"; do
  IFS='|' read -r mode rps p99 ch cc kh kc calls checks most <<<"$r"
  read -r max over windows <<<"$most"
  case "$mode" in
    memory) runs_hot="-"; runs_cold="-"; per_call="-"
      over="- (each instance its own limit)"; windows="" ;;
    exact) runs_hot="1.000"; runs_cold="1.000"  # every check runs its script once
      per_call="$(awk -v a="$calls" -v b="$checks" 'BEGIN { printf "%.3f", b ? a / b : 0 }')" ;;
    lease) runs_hot="$(awk -v a="$kh" -v b="$ch" 'BEGIN { printf "%.4f", b ? a / b : 0 }')"
      runs_cold="$(awk -v a="$kc" -v b="$cc" 'BEGIN { printf "%.3f", b ? a / b : 0 }')"
      per_call="$(awk -v a="$calls" -v b="$((ch + cc))" 'BEGIN { printf "%.3f", b ? a / b : 0 }')" ;;
  esac
  printf '%-7s %11.0f %17s %15s %15s %12s %14s (over: %s%s)\n' "$mode" "$rps" "$p99" "$runs_hot" "$runs_cold" \
    "$per_call" "$max/$limit" "$over" "${windows:+ of $windows}"
done
rps_of() { for r in "${results[@]}"; do [ "${r%%|*}" = "$1" ] && cut -d'|' -f2 <<<"$r"; done; }
hot_runs="$(for r in "${results[@]}"; do [ "${r%%|*}" = lease ] && awk -F'|' '{ printf "%.6f", $4 ? $6 / $4 : 0 }' <<<"$r"; done)"
awk -v l="$(rps_of lease)" -v m="$(rps_of memory)" -v e="$(rps_of exact)" -v h="$hot_runs" 'BEGIN {
  printf "lease / memory checks/s: %.2f (target >= 0.8); lease / exact: %.2f\n", l / m, l / e
  # (parenthesised: a bare ">" among the arguments of printf would redirect its output to a file)
  printf "hot keys: %.1f x fewer Redis script runs per check than exact mode (target >= 10)\n", (h > 0 ? 1 / h : 0) }'
