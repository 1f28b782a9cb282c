#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# sluiced vs nginx limit_req, same machine, same run, same load generator.
#
# wrk (64 connections, ids spread over 100,000 keys) against:
#   1. sluiced, memory backend: POST /v1/check {"rule":"bench","key":"user:N"}
#   2. nginx: limit_req keyed on the X-User-Id header over the same ids, serving a small static
#      file (limit_req does not apply to a location that answers with `return`)
#   3. sluiced, Redis backend (when redis-server is installed), on a sliding-window-log rule, then
#      that script's ceiling on the same redis-server: redis-benchmark -c 50 -P 16, one check a
#      call, as bench/redis/run.sh measures it (SCRIPT_TOOL: build/bench/redis_benchmark)
# and prints requests/s and p99 latency of each, plus sluiced's share of nginx's requests/s.
#
# sluiced's CPU per request (user + system time of the process over the run, from /proc) is printed
# beside each of its runs. BEFORE=path/to/an/older/sluiced runs that binary in turn with this one on
# Redis (ROUNDS rounds, default 2) and prints the ratios of requests/s and of CPU per request.
#
#   bench/server/run.sh [SLUICED]          # default: build/src/server/sluiced (a Release build)
#   DURATION=10s CONNECTIONS=64 WRK_THREADS=2 bench/server/run.sh
#   BEFORE=/tmp/before/sluiced ROUNDS=2 bench/server/run.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
sluiced="${1:-$root/build/src/server/sluiced}"
script_tool="${SCRIPT_TOOL:-$root/build/bench/redis_benchmark}"  # prints the scripts (the Redis ceiling)
duration="${DURATION:-10s}"
before="${BEFORE:-}"
rounds="${ROUNDS:-2}"
connections="${CONNECTIONS:-64}"
wrk_threads="${WRK_THREADS:-2}"
[ -x "$sluiced" ] || { echo "no sluiced at $sluiced (build it first: make build)" >&2; exit 1; }
for tool in wrk nginx python3; do
  command -v "$tool" >/dev/null || { echo "$tool is required (scripts/deps installs it)" >&2; exit 1; }
done

source "$here/../lib.sh"
chmod 755 "$work"  # nginx workers (user nobody when started as root) read the static file

# The same limit on both sides: 100 per second per id, bursts of 100. At these request rates each
# of the 100,000 ids is asked about less than once a second, so both admit nearly everything and
# the comparison is of the decision path, not of 429 handling.
rule='[[rules]]
name = "bench"
algorithm = "token_bucket"
rate = 100
burst = 100'

window_rule='[[rules]]
name = "bench_window"
algorithm = "sliding_window"
limit = 1000
window = "60s"'

results=()
hz="$(getconf CLK_TCK)"
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }  # user + system
run_wrk() {  # run_wrk NAME URL SCRIPT [RULE [PID]]: PID, the server's, for its CPU per request
  local name="$1" url="$2" script="$3" rule_name="${4:-bench}" pid="${5:-}" out ticks=0
  [ -n "$pid" ] && ticks="$(cpu_ticks "$pid")"
  out="$(RULE="$rule_name" wrk -t"$wrk_threads" -c"$connections" -d"$duration" --latency -s "$script" "$url")"
  echo "$out" >"$work/$name.wrk"
  local rps p99 non2xx requests cpu=-
  rps="$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")"
  p99="$(awk '$1 == "99%" {print $2}' <<<"$out")"
  non2xx="$(awk '/Non-2xx or 3xx responses:/ {print $5}' <<<"$out")"
  requests="$(awk '/requests in/ {print $1}' <<<"$out")"
  if [ -n "$pid" ]; then
    cpu="$(awk -v t="$(($(cpu_ticks "$pid") - ticks))" -v hz="$hz" -v n="$requests" \
      'BEGIN { printf "%.1f", t / hz * 1e6 / n }')"
  fi
  results+=("$name|$rps|$p99|${non2xx:-0}|$cpu")
}

# --- 1. sluiced, memory backend ----------------------------------------------------------------
port="$(free_port)"
cat >"$work/memory.toml" <<TOML
[server]
listen = "127.0.0.1:$port"
threads = 0
[backend]
type = "memory"
$rule
TOML
"$sluiced" --config "$work/memory.toml" 2>"$work/sluiced-memory.log" &
pids+=($!)
wait_http "http://127.0.0.1:$port/healthz"
run_wrk "sluiced (memory)" "http://127.0.0.1:$port" "$here/check.lua" bench "${pids[-1]}"
kill "${pids[-1]}"; wait "${pids[-1]}" || true

# --- 2. nginx limit_req ------------------------------------------------------------------------
nport="$(free_port)"
mkdir -p "$work/nginx/html" "$work/nginx/logs" "$work/nginx/tmp"
printf 'ok\n' >"$work/nginx/html/index.html"
cat >"$work/nginx/nginx.conf" <<NGINX
worker_processes auto;
pid $work/nginx/nginx.pid;
error_log $work/nginx/logs/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $work/nginx/tmp/body;
  proxy_temp_path $work/nginx/tmp/proxy;
  fastcgi_temp_path $work/nginx/tmp/fastcgi;
  uwsgi_temp_path $work/nginx/tmp/uwsgi;
  scgi_temp_path $work/nginx/tmp/scgi;
  limit_req_zone \$http_x_user_id zone=ids:32m rate=100r/s;
  limit_req_status 429;
  server {
    listen 127.0.0.1:$nport;
    root $work/nginx/html;
    location / {
      limit_req zone=ids burst=100 nodelay;
    }
  }
}
NGINX
nginx -p "$work/nginx" -c "$work/nginx/nginx.conf" -g 'daemon off;' 2>"$work/nginx/logs/stderr.log" &
pids+=($!)
wait_http "http://127.0.0.1:$nport/index.html"
run_wrk "nginx limit_req" "http://127.0.0.1:$nport" "$here/nginx.lua"
kill "${pids[-1]}"; wait "${pids[-1]}" || true

# --- 3. sluiced, Redis backend -----------------------------------------------------------------
if command -v redis-server >/dev/null; then
  rport="$(free_port)"
  start_redis "$rport" redis
  port="$(free_port)"
  cat >"$work/redis.toml" <<TOML
[server]
listen = "127.0.0.1:$port"
[backend]
type = "redis"
addresses = ["127.0.0.1:$rport"]
timeout_ms = 200
$rule
$window_rule
TOML
  redis_run() {  # redis_run NAME BINARY
    "$2" --config "$work/redis.toml" 2>"$work/sluiced-redis.log" &
    pids+=($!)
    wait_ok "http://127.0.0.1:$port/readyz"  # connected to Redis: no check of the run fails open
    run_wrk "$1" "http://127.0.0.1:$port" "$here/check.lua" bench_window "${pids[-1]}"
    curl -s "http://127.0.0.1:$port/metrics" | grep -q 'sluice_checks_total{rule="bench_window",result="allowed"}' ||
      { echo "the Redis run did not check rule bench_window" >&2; exit 1; }
    if curl -s "http://127.0.0.1:$port/metrics" | grep -q 'sluice_fail_open_total [1-9]'; then
      echo "warning: some Redis checks failed open during the run" >&2
    fi
    kill "${pids[-1]}"; wait "${pids[-1]}" || true
  }
  if "$sluiced" --check-config --config "$work/redis.toml" >/dev/null 2>&1; then
    redis_run "sluiced (redis)" "$sluiced"
    if [ -n "$before" ]; then
      for round in $(seq 1 "$rounds"); do
        redis_run "before (redis) $round" "$before"
        redis_run "after (redis) $round" "$sluiced"
      done
    fi
    # The ceiling: the same script one check a call from redis-benchmark (as bench/redis/run.sh
    # measures it) on the same redis-server: 1,000 per 60 s in the script's hex arguments.
    if [ -x "$script_tool" ]; then
      sha="$(redis-cli -p "$rport" SCRIPT LOAD "$("$script_tool" --script-body sliding_window_log)")"
      redis-cli -p "$rport" FLUSHALL >/dev/null
      log_calls() {
        redis-benchmark -p "$rport" -c 50 -P 16 -n 300000 -r 100000 -q EVALSHA "$sha" 1 "ceiling:__rand_int__" \
          - 1 3e8 3938700 0 ffffffffffffffff | tr '\r' '\n' | grep -v '^$' | tail -1
      }
      log_calls >/dev/null  # a warm-up of as many calls first: sluiced's run checked keys that existed, mostly
      ceiling="$(log_calls | sed -n 's/.*: \([0-9.]*\) requests per second.*/\1/p')"
    fi
  fi
fi

echo
echo "wrk -t$wrk_threads -c$connections -d$duration, ids over 100,000 keys, $(nproc) cores"
printf '%-18s %12s %10s %10s %12s\n' "target" "requests/s" "p99" "non-2xx" "CPU µs/req"
for r in "${results[@]}"; do
  IFS='|' read -r name rps p99 non2xx cpu <<<"$r"
  printf '%-18s %12s %10s %10s %12s\n' "$name" "$rps" "$p99" "$non2xx" "$cpu"
done
mem_rps="$(cut -d'|' -f2 <<<"${results[0]}")"
nginx_rps="$(cut -d'|' -f2 <<<"${results[1]}")"
awk -v a="$mem_rps" -v b="$nginx_rps" 'BEGIN { printf "sluiced (memory) / nginx: %.0f%% of nginx requests/s (target >= 80%%)\n", 100 * a / b }'
if [ -n "${ceiling:-}" ]; then
  redis_rps="$(cut -d'|' -f2 <<<"${results[2]}")"
  awk -v a="$redis_rps" -v b="$ceiling" 'BEGIN { printf "sluiced (redis) / redis-benchmark one-check ceiling of the same script (%.0f calls/s): %.2f (target >= 0.9)\n", b, a / b }'
fi
if [ -n "$before" ]; then
  for round in $(seq 1 "$rounds"); do
    b="$(printf '%s\n' "${results[@]}" | grep "^before (redis) $round|")"
    a="$(printf '%s\n' "${results[@]}" | grep "^after (redis) $round|")"
    awk -F'|' -v a="$a" -v b="$b" -v r="$round" 'BEGIN {
      split(a, x, "|"); split(b, y, "|")
      printf "round %d, this sluiced / BEFORE: requests/s %.2f, CPU per request %.2f (target <= 0.8)\n", r, x[2] / y[2], x[5] / y[5]
    }'
  done
fi
