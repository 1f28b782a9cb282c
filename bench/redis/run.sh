#!/usr/bin/env bash
# Benchmarks the Redis backend against its ceiling, on a redis-server of its own.
#
#   bench/redis/run.sh [path/to/redis_benchmark]      (default: build/bench/redis_benchmark)
#
# 1. starts redis-server on a free 127.0.0.1 port (no persistence) in a temporary directory;
# 2. the ceiling: redis-benchmark -c 50 -P 16 running EVALSHA of the seed note's sliding-window
#    script over 100,000 keys, then of sluice's own sliding-window-log script, each with its server
#    time per call (INFO commandstats);
# 3. redis_benchmark: each of our scripts with 64 checks in flight over 100,000 keys: throughput,
#    p50/p99 latency, server time per call, Redis memory per key;
# then stops that redis-server (by its PID). Every loop is bounded.
set -euo pipefail
cd "$(dirname "$0")/../.."

bench=${1:-build/bench/redis_benchmark}
checks=${CHECKS:-300000}
[ -x "$bench" ] || { echo "run.sh: $bench not built (cmake --preset release; cmake --build build --target redis_benchmark)" >&2; exit 1; }

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
dir=$(mktemp -d /tmp/sluice-bench-redis-XXXXXX)
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" --daemonize no \
  --logfile "$dir/redis.log" &
pid=$!
cleanup() { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT

cli() { redis-cli -p "$port" "$@"; }
for _ in $(seq 1 100); do cli PING >/dev/null 2>&1 && break; sleep 0.05; done
cli PING >/dev/null

# The seed note's script, verbatim (ARGV: now, window, limit, member).
seed=$(cat <<'LUA'
local now = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])

redis.call('ZREMRANGEBYSCORE', KEYS[1], 0, now - window)
local count = redis.call('ZCARD', KEYS[1])

if count < limit then
    redis.call('ZADD', KEYS[1], now, ARGV[4])
    redis.call('PEXPIRE', KEYS[1], window)
    return {1, limit - count - 1, now + window}
end

local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local resetAt = now + window
if oldest[2] then
    resetAt = tonumber(oldest[2]) + window
end
return {0, 0, resetAt}
LUA
)
sha=$(cli SCRIPT LOAD "$seed")

echo "== redis-server $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p') on 127.0.0.1:$port, $(nproc) cores"
echo "== ceiling: redis-benchmark -c 50 -P 16, EVALSHA of the seed script, 100,000 keys"
cli CONFIG RESETSTAT >/dev/null
# now = a random int below the window, so entries stay in the window; member unique per request.
redis-benchmark -p "$port" -c 50 -P 16 -n "$checks" -r 100000 -q \
  EVALSHA "$sha" 1 "seed:__rand_int__" "__rand_int__" 60000 100 "__rand_int__" | tr '\r' '\n' | grep -v '^$' | tail -1
cli INFO commandstats | tr -d '\r' | grep '^cmdstat_evalsha' | sed 's/^/   /'
cli FLUSHALL >/dev/null

# The same ceiling for our own sliding-window-log script (server time, -1 = read Redis TIME; the last -1: no deadline).
ours=$(cli SCRIPT LOAD "$("$bench" --script-body sliding_window_log)")
echo "== ceiling: redis-benchmark -c 50 -P 16, EVALSHA of sluice's sliding_window_log script, 100,000 keys"
cli CONFIG RESETSTAT >/dev/null
redis-benchmark -p "$port" -c 50 -P 16 -n "$checks" -r 100000 -q \
  EVALSHA "$ours" 1 "ours:__rand_int__" -1 1 100 60000000 0 -1 | tr '\r' '\n' | grep -v '^$' | tail -1
cli INFO commandstats | tr -d '\r' | grep '^cmdstat_evalsha' | sed 's/^/   /'
cli FLUSHALL >/dev/null

echo "== sluice redis backend: 64 checks in flight, 100,000 keys, $checks checks per script"
"$bench" --address "127.0.0.1:$port" --inflight 64 --keys 100000 --checks "$checks"
