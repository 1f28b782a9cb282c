#!/usr/bin/env bash
# Envoy's rate-limit API (gRPC) beside sluiced's own HTTP API, same process, same run.
#
# One sluiced per backend (memory; Redis when redis-server is installed) serves both APIs with the
# same limit: a fixed window of 100 per second per id, over ids spread uniformly over 100,000
# values. In turn, ROUNDS times: wrk POSTs /v1/check (64 connections), then rls_load keeps 64
# ShouldRateLimit calls in flight. Prints calls/s and p99 of each, and gRPC's share of HTTP's.
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
  wait_http "http://127.0.0.1:$port/healthz"
  for round in $(seq 1 "$rounds"); do
    local out rps p99 line
    out="$(RULE=bench_fw wrk -t2 -c"$in_flight" -d"${duration}s" --latency -s "$root/bench/server/check.lua" \
      "http://127.0.0.1:$port")"
    rps="$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")"
    p99="$(awk '$1 == "99%" {print $2}' <<<"$out")"
    results+=("$name|HTTP /v1/check|$round|$rps|$p99")
    line="$("$load" --target "127.0.0.1:$gport" --domain bench --key user --seconds "$duration" \
      --in-flight "$in_flight" --threads 2 --values 100000)"
    rps="$(sed -n 's/.* rps=\([0-9]*\).*/\1/p' <<<"$line")"
    p99="$(sed -n 's/.* p99_us=\([0-9]*\).*/\1/p' <<<"$line")us"
    results+=("$name|gRPC ShouldRateLimit|$round|$rps|$p99")
  done
  curl -s "http://127.0.0.1:$port/metrics" | grep -q 'sluice_envoy_hits_total{domain="bench",descriptor="user"} [1-9]' ||
    { echo "the $name run did not count the Envoy descriptor" >&2; exit 1; }
  kill "${pids[-1]}"; wait "${pids[-1]}" || true
}

measure memory '[backend]
type = "memory"'
if command -v redis-server >/dev/null; then
  rport="$(free_port)"
  redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" >/dev/null &
  pids+=($!)
  wait_redis "$rport"
  measure redis "[backend]
type = \"redis\"
addresses = [\"127.0.0.1:$rport\"]
timeout_ms = 200"
fi

echo
echo "$in_flight in flight, ids over 100,000 values, ${duration}s per run, $rounds rounds in turn, $(nproc) cores"
printf '%-8s %-22s %6s %12s %10s\n' "backend" "API" "round" "calls/s" "p99"
for r in "${results[@]}"; do
  IFS='|' read -r backend api round rps p99 <<<"$r"
  printf '%-8s %-22s %6s %12s %10s\n' "$backend" "$api" "$round" "$rps" "$p99"
done
# gRPC / HTTP per round (each gRPC run beside the HTTP run just before it).
for backend in memory redis; do
  ratios=""
  http=""
  for r in "${results[@]}"; do
    IFS='|' read -r b api round rps p99 <<<"$r"
    [ "$b" = "$backend" ] || continue
    if [ "$api" = "HTTP /v1/check" ]; then http="$rps"; else
      ratios+="$(awk -v g="$rps" -v h="$http" 'BEGIN { printf "%.2f ", g / h }')"
    fi
  done
  [ -n "$ratios" ] && echo "$backend: gRPC / HTTP calls/s per round: $ratios"
done
