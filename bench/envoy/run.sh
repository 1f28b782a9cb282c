#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Envoy's rate-limit API (gRPC) beside sluiced's own HTTP API, same process, same run.
#
# One sluiced per backend (memory; Redis when redis-server is installed) serves both APIs with the
# same limit: a fixed window of 100 per second per id, over ids spread uniformly over 100,000
# values. In turn, ROUNDS times: wrk POSTs /v1/check (64 connections), then rls_load keeps 64
# ShouldRateLimit calls in flight. Prints calls/s and p99 of each, the CPU per call of sluiced,
# the load client and Redis over each run, and gRPC's share of HTTP's calls/s.
#
#   bench/envoy/run.sh [SLUICED] [RLS_LOAD]   # default: build/src/server/sluiced, build/bench/rls_load
#   DURATION=10 ROUNDS=2 bench/envoy/run.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
sluiced="${1:-$root/build/src/server/sluiced}"
load="${2:-$root/build/bench/rls_load}"
duration="${DURATION:-10}"
rounds="${ROUNDS:-2}"
in_flight="${IN_FLIGHT:-64}"
[ -x "$sluiced" ] || { echo "no sluiced at $sluiced (build it first: make build)" >&2; exit 1; }
[ -x "$load" ] || { echo "no rls_load at $load (build it first: make build)" >&2; exit 1; }
for tool in wrk python3 curl; do
  command -v "$tool" >/dev/null || { echo "$tool is required (scripts/deps installs it)" >&2; exit 1; }
done
source "$here/../lib.sh"

mkdir -p "$work/envoy"
cat >"$work/envoy/bench.yaml" <<'YAML'
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 100}
YAML
rule='[[rules]]
name = "bench_fw"
algorithm = "fixed_window"
limit = 100
window = "1s"'

results=()
redis_pid=""
hz="$(getconf CLK_TCK)"
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }  # user + system
# per_call CPU PER_SECOND CALLS: CPU µs per call, CPU counted PER_SECOND to the second (clock ticks:
# $hz; seconds: 1)
per_call() { awk -v t="$1" -v hz="$2" -v n="$3" 'BEGIN { if (n > 0) printf "%.1f", t / hz * 1e6 / n; else print "-" }'; }
# timed OUT CMD...: runs CMD with its stdout in OUT; prints the CPU seconds (user + system) it took,
# and fails as CMD does.
timed() {
  local out="$1" TIMEFORMAT='%U %S' status=0
  shift
  { time "$@" >"$out" 2>>"$work/load.err"; } 2>"$work/time" || status=$?
  awk '{print $1 + $2}' "$work/time"
  return "$status"
}
# run_load NAME API ROUND OUT CMD...: one run, with each process's CPU per call beside its figures.
run_load() {
  local name="$1" api="$2" round="$3" out="$4" s0 r0 client calls rps p99
  shift 4
  s0="$(cpu_ticks "$sluiced_pid")"; r0="$(cpu_ticks "${redis_pid:-0}")"
  client="$(timed "$out" "$@")" || { echo "the $name $api run failed: $(tail -3 "$work/load.err")" >&2; exit 1; }
  local sluiced_us redis_us client_us
  if [ "$api" = "HTTP /v1/check" ]; then
    calls="$(awk '/ requests in / {print $1}' "$out")"
    rps="$(awk '/^Requests\/sec:/ {print $2}' "$out")"
    p99="$(awk '$1 == "99%" {print $2}' "$out")"
  else
    calls="$(sed -n 's/^calls=\([0-9]*\) .*/\1/p' "$out")"
    rps="$(sed -n 's/.* rps=\([0-9]*\).*/\1/p' "$out")"
    p99="$(sed -n 's/.* p99_us=\([0-9]*\).*/\1/p' "$out")us"
  fi
  sluiced_us="$(per_call $(($(cpu_ticks "$sluiced_pid") - s0)) "$hz" "$calls")"
  redis_us="-"
  [ -n "$redis_pid" ] && redis_us="$(per_call $(($(cpu_ticks "$redis_pid") - r0)) "$hz" "$calls")"
  client_us="$(per_call "$client" 1 "$calls")"
  results+=("$name|$api|$round|$rps|$p99|$sluiced_us|$client_us|$redis_us")
}

# measure NAME BACKEND_TOML: one sluiced, ROUNDS of (HTTP, gRPC).
measure() {
  local name="$1" backend="$2" port gport
  port="$(free_port)"
  gport="$(free_port)"
  cat >"$work/$name.toml" <<TOML
[server]
listen = "127.0.0.1:$port"
grpc_listen = "127.0.0.1:$gport"
[envoy]
config_dir = "envoy"
$backend
$rule
TOML
  "$sluiced" --config "$work/$name.toml" 2>"$work/sluiced-$name.log" &
  pids+=($!)
  sluiced_pid=$!
  wait_http "http://127.0.0.1:$port/healthz"
  for round in $(seq 1 "$rounds"); do
    run_load "$name" "HTTP /v1/check" "$round" "$work/http.out" env RULE=bench_fw wrk -t2 -c"$in_flight" \
      -d"${duration}s" --latency -s "$root/bench/server/check.lua" "http://127.0.0.1:$port"
    run_load "$name" "gRPC ShouldRateLimit" "$round" "$work/grpc.out" "$load" --target "127.0.0.1:$gport" \
      --domain bench --key user --seconds "$duration" --in-flight "$in_flight" --threads 2 --values 100000
  done
  curl -s "http://127.0.0.1:$port/metrics" | grep -q 'sluice_envoy_hits_total{domain="bench",descriptor="user"} [1-9]' ||
    { echo "the $name run did not count the Envoy descriptor" >&2; exit 1; }
  kill "${pids[-1]}"; wait "${pids[-1]}" || true
}

measure memory '[backend]
type = "memory"'
if command -v redis-server >/dev/null; then
  rport="$(free_port)"
  start_redis "$rport" redis
  redis_pid="${pids[-1]}"
  measure redis "[backend]
type = \"redis\"
addresses = [\"127.0.0.1:$rport\"]
timeout_ms = 200"
fi

echo
echo "$in_flight in flight, ids over 100,000 values, ${duration}s per run, $rounds rounds in turn, $(nproc) cores"
echo "CPU per call (µs, user + system over the run): sluiced's, the load client's (wrk or rls_load), Redis's"
printf '%-8s %-22s %6s %12s %10s %8s %8s %8s\n' "backend" "API" "round" "calls/s" "p99" "sluiced" "client" "Redis"
for r in "${results[@]}"; do
  IFS='|' read -r backend api round rps p99 s_us c_us r_us <<<"$r"
  printf '%-8s %-22s %6s %12s %10s %8s %8s %8s\n' "$backend" "$api" "$round" "$rps" "$p99" "$s_us" "$c_us" "$r_us"
done
# gRPC / HTTP per round (each gRPC run beside the HTTP run just before it).
for backend in memory redis; do
  ratios=""
  http=""
  for r in "${results[@]}"; do
    IFS='|' read -r b api round rps p99 _ <<<"$r"
    [ "$b" = "$backend" ] || continue
    if [ "$api" = "HTTP /v1/check" ]; then http="$rps"; else
      ratios+="$(awk -v g="$rps" -v h="$http" 'BEGIN { printf "%.2f ", g / h }')"
    fi
  done
  [ -n "$ratios" ] && echo "$backend: gRPC / HTTP calls/s per round: $ratios"
done
