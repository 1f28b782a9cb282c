#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/http/run.sh — the HTTP middleware's cost: wrk against notes_beast's rate-limited GET /public
# with the middleware on (memory backend) and switched off (--no-limit), in one run, alternating.
#
#   bench/http/run.sh [path/to/notes_beast]      (default: build/examples/notes_beast, a Release build)
#   DURATION=10s CONNECTIONS=32 ROUNDS=2 SERVER_THREADS=1 bench/http/run.sh
#
# Prints requests/s, p99 latency and the server's CPU time per request for each configuration, and
# the relative cost; then, when valgrind is installed, the instructions per request of each under
# callgrind (stable on a noisy machine): the difference between serving 4,000 and 1,000 requests
# on one keep-alive connection, over 3,000. On a busy machine req/s swings; CPU per request is the steadier figure. Everything listens on
# 127.0.0.1; each server is stopped by its PID.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
bin=${1:-${NOTES_BEAST:-$here/../../build/examples/notes_beast}}
duration=${DURATION:-10s}
connections=${CONNECTIONS:-32}
rounds=${ROUNDS:-2}
server_threads=${SERVER_THREADS:-1}
[[ -x $bin ]] || { echo "notes_beast not found at $bin (build it: cmake --preset release && cmake --build build --target notes_beast)" >&2; exit 1; }
command -v wrk >/dev/null || { echo "wrk is not installed" >&2; exit 1; }

tmp=$(mktemp -d)
server_pid=""
cleanup() {
  if [[ -n $server_pid ]]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

# run_one NAME ARGS... : starts the server, runs wrk, appends "NAME rps p99_ms non2xx" to $tmp/results.
run_one() {
  local name=$1; shift
  rm -f "$tmp/server.out"  # the redirection below happens in the child, later: never read a stale port
  "$bin" --listen 127.0.0.1:0 --threads "$server_threads" --trusted-proxy 127.0.0.1/32 "$@" >"$tmp/server.out" 2>"$tmp/server.err" &
  server_pid=$!
  local port=""
  for _ in $(seq 100); do
    port=$(sed -n 's/^listening on http:\/\/127\.0\.0\.1:\([0-9]*\)$/\1/p' "$tmp/server.out" 2>/dev/null || true)
    [[ -n $port ]] && break
    sleep 0.05  # waiting for the server process to bind, not for a limiter
  done
  [[ -n $port ]] || { echo "server did not start: $(cat "$tmp/server.err")" >&2; exit 1; }
  wrk -t1 -c"$connections" -d"$duration" --latency -s "$here/public_xff.lua" "http://127.0.0.1:$port/public" >"$tmp/wrk.out"
  # The server's CPU time (user + system, clock ticks) per request: steadier than req/s on a busy machine.
  local ticks
  ticks=$(awk '{print $14 + $15}' "/proc/$server_pid/stat" 2>/dev/null || echo 0)
  if ! kill "$server_pid" 2>/dev/null; then
    echo "server ($name) died during the run: $(cat "$tmp/server.err")" >&2
    exit 1
  fi
  wait "$server_pid" 2>/dev/null || true; server_pid=""
  local rps p99 non2xx requests cpu_us
  rps=$(awk '/^Requests\/sec:/ {print $2}' "$tmp/wrk.out")
  requests=$(awk '/requests in/ {print $1}' "$tmp/wrk.out")
  cpu_us=$(awk -v t="$ticks" -v n="${requests:-0}" -v hz="$(getconf CLK_TCK)" 'BEGIN { if (n > 0) printf "%.2f", t / hz * 1e6 / n; else print 0 }')
  # wrk prints latencies as 123.45us / 1.23ms / 1.23s; convert to ms.
  p99=$(awk '$1 == "99%" { v = $2; if (v ~ /us$/) { sub(/us$/, "", v); v /= 1000 } else if (v ~ /ms$/) { sub(/ms$/, "", v) } else if (v ~ /s$/) { sub(/s$/, "", v); v *= 1000 } print v }' "$tmp/wrk.out")
  non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $5}' "$tmp/wrk.out")
  echo "$name ${rps:-0} ${p99:-0} ${non2xx:-0} $cpu_us" >>"$tmp/results"
  printf '  %-4s %12s req/s   p99 %8s ms   server CPU %6s us/request   non-2xx %s\n' "$name" "$rps" "$p99" "$cpu_us" "${non2xx:-0}"
}

echo "notes_beast GET /public, wrk -t1 -c$connections -d$duration, server threads: $server_threads, rounds: $rounds"
for r in $(seq "$rounds"); do
  echo "round $r"
  run_one off --no-limit
  run_one on
done

awk '
  { n[$1]++; rps[$1] += $2; p99[$1] += $3; non[$1] += $4; cpu[$1] += $5 }
  END {
    off_rps = rps["off"] / n["off"]; on_rps = rps["on"] / n["on"]
    off_p99 = p99["off"] / n["off"]; on_p99 = p99["on"] / n["on"]
    off_cpu = cpu["off"] / n["off"]; on_cpu = cpu["on"] / n["on"]
    printf "mean of %d rounds:\n", n["on"]
    printf "  middleware off: %10.0f req/s   p99 %.3f ms   server CPU %.2f us/request\n", off_rps, off_p99, off_cpu
    printf "  middleware on:  %10.0f req/s   p99 %.3f ms   server CPU %.2f us/request   (429s: %d)\n", on_rps, on_p99, on_cpu, non["on"]
    printf "  cost: %.1f%% of throughput, p99 %+.3f ms, %+.2f us (%.1f%%) server CPU per request\n",
           (off_rps - on_rps) / off_rps * 100, on_p99 - off_p99, on_cpu - off_cpu, (on_cpu - off_cpu) / off_cpu * 100
  }' "$tmp/results"

# --- instructions per request under callgrind ----------------------------------------------------
command -v valgrind >/dev/null || { echo "valgrind is not installed: no instruction counts"; exit 0; }
instructions() {  # instructions REQUESTS ARGS...: the server's instructions serving REQUESTS requests
  local n=$1; shift
  rm -f "$tmp/server.out" "$tmp/callgrind.out"
  valgrind --tool=callgrind --callgrind-out-file="$tmp/callgrind.out" "$bin" --listen 127.0.0.1:0 --threads 1 \
    --trusted-proxy 127.0.0.1/32 "$@" >"$tmp/server.out" 2>"$tmp/server.err" &
  server_pid=$!
  local port=""
  for _ in $(seq 200); do
    port=$(sed -n 's/^listening on http:\/\/127\.0\.0\.1:\([0-9]*\)$/\1/p' "$tmp/server.out" 2>/dev/null || true)
    [[ -n $port ]] && break
    sleep 0.05  # valgrind starts the server slowly
  done
  [[ -n $port ]] || { echo "server did not start under valgrind: $(cat "$tmp/server.err")" >&2; exit 1; }
  python3 "$here/keepalive_client.py" "$port" "$n"
  kill -INT "$server_pid"; wait "$server_pid" 2>/dev/null || true; server_pid=""
  awk '/^(summary|totals):/ { print $2; exit }' "$tmp/callgrind.out"
}
per_request() {  # per_request ARGS...
  local a b
  a=$(instructions 1000 "$@"); b=$(instructions 4000 "$@")
  echo $(((b - a) / 3000))
}
off_ir=$(per_request --no-limit)
on_ir=$(per_request)
echo "callgrind, instructions per request: middleware off $off_ir, on $on_ir, added $((on_ir - off_ir))"
