#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Benchmarks the Redis backend against its ceiling, on a redis-server of its own.
#
#   bench/redis/run.sh [path/to/redis_benchmark]      (default: build/bench/redis_benchmark)
#
# 1. starts redis-server on a free 127.0.0.1 port (no persistence) in a temporary directory;
# 2. one check a call: redis-benchmark -c 50 -P 16 running EVALSHA over 100,000 keys of the seed
#    note's sliding-window script, of a script doing only TIME, and of each of sluice's four
#    scripts (the rules of step 3), each with its server time per call (INFO commandstats) and its
#    ratio to the seed script's, and the log's beside the seed's plus TIME alone's; the log's
#    throughput is the ceiling step 3 is compared with;
# 3. redis_benchmark: each of our scripts with 64 checks in flight over 100,000 keys: throughput,
#    p50/p99 latency, server time per call, Redis memory per key; then the same with every check
#    its own call (--max-batch 1), and the batched throughput beside both that and step 2's;
# 4. when valgrind is installed, step 2's calls again on a redis-server under callgrind: the
#    instructions per call, a figure this shared machine's load does not move (the log's beside
#    the seed's plus TIME alone's again);
# 5. then, on another redis-server under callgrind counting all it does (reading calls and writing
#    replies too), each of our scripts one check a call beside the same work batched by
#    redis_benchmark: what batching saves Redis per check;
# then stops those redis-servers (by their PIDs). Every loop is bounded.
set -euo pipefail
cd "$(dirname "$0")/../.."

bench=${1:-build/bench/redis_benchmark}
checks=${CHECKS:-300000}
[ -x "$bench" ] || { echo "run.sh: $bench not built (cmake --preset release; cmake --build build --target redis_benchmark)" >&2; exit 1; }

source bench/lib.sh  # work (a temporary directory), pids (ended at exit), free_port, start_redis

# evalsha_calls PORT CLIENTS CALLS KEYS NAME SHA ARGS...: redis-benchmark sending CALLS EVALSHA of
# SHA on the keys NAME:0..KEYS-1, 16 pipelined per client; prints its summary line.
evalsha_calls() {
  local p=$1 clients=$2 calls=$3 keys=$4 name=$5 sha=$6
  shift 6
  redis-benchmark -p "$p" -c "$clients" -P 16 -n "$calls" -r "$keys" -q EVALSHA "$sha" 1 "$name:__rand_int__" "$@" |
    tr '\r' '\n' | grep -v '^$' | tail -1
}

port=$(free_port)
start_redis "$port" redis
cli() { redis-cli -p "$port" "$@"; }

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

# What taking the time from Redis costs alone: TIME, and the reply every script ends with.
time_only='#!lua
local t = redis.call("TIME")
return {1, 1, 0, 1, tonumber(t[1]) * 1000000 + tonumber(t[2])}'
# The least a check that keeps state in one string can do: TIME, GET, SET with a TTL, constants for
# the value and the reply.
floor='#!lua
local t = redis.call("TIME")
local v = redis.call("GET", KEYS[1])
redis.call("SET", KEYS[1], "0123456789abcdef", "PX", 60000)
return {1, 1, 0, 1, tonumber(t[1]) * 1000000 + tonumber(t[2])}'

# The scripts measured one check a call, each "name|arguments". The seed's now is a random int below
# its window, so entries stay in the window, and its member is unique per call. sluice's scripts take
# hex numbers (src/redis/scripts.hpp): now "-" (Redis's TIME), cost 1, the rule's three parameters,
# no deadline; the rules of step 3: a bucket of 100 refilling 100 an hour (interval 36 s, in ns),
# 100 per 60 s windows (in µs).
calls="seed|__rand_int__ 60000 100 __rand_int__
TIME alone|
TIME+GET+SET|
token_bucket|- 1 861c46800 3463e6c0000 64 ffffffffffffffff
sliding_window_log|- 1 64 3938700 0 ffffffffffffffff
sliding_window_counter|- 1 64 3938700 0 ffffffffffffffff
fixed_window|- 1 64 3938700 0 ffffffffffffffff"

body_of() {
  case $1 in
    seed) printf '%s' "$seed" ;;
    "TIME alone") printf '%s' "$time_only" ;;
    "TIME+GET+SET") printf '%s' "$floor" ;;
    *) "$bench" --script-body "$1" ;;
  esac
}

# each_call PORT FN: loads every script of $calls into the server on PORT, then for each runs
# FN NAME SHA ARGS... after emptying the server and its command statistics.
each_call() {
  local p=$1 fn=$2 name args sha
  while IFS='|' read -r name args; do
    sha=$(redis-cli -p "$p" SCRIPT LOAD "$(body_of "$name")")
    redis-cli -p "$p" FLUSHALL >/dev/null
    redis-cli -p "$p" CONFIG RESETSTAT >/dev/null
    # shellcheck disable=SC2086  # the arguments are words
    "$fn" "$name" "$sha" $args
  done <<<"$calls"
}

echo "== redis-server $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p') on 127.0.0.1:$port, $(nproc) cores"
echo "== one check a call: redis-benchmark -c 50 -P 16, EVALSHA, 100,000 keys, $checks calls each"
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

# Prints a script's calls/s, its server µs per call and that as a ratio to the seed script's. A
# warm-up of as many calls first, so that most keys exist, as they do when step 3 measures (after a
# check of every key).
seed_us=
# shellcheck disable=SC2034  # read through log_target's nameref
declare -A us_of ir_of  # each script's server µs and instructions per call, for log_target
# log_target ARRAY UNIT: the log script's cost per call beside the seed script's plus that of a
# script doing only TIME (what reading Redis's clock costs a call), from this run.
log_target() {
  local -n of=$1
  awk -v log_cost="${of[sliding_window_log]}" -v seed="${of[seed]}" -v t="${of[TIME alone]}" -v unit="$2" \
    'BEGIN { printf "   sliding window log: %s %s per call beside the seed script + TIME alone: %s + %s = %s (%.2f ×)\n",
                    log_cost, unit, seed, t, seed + t, log_cost / (seed + t) }'
}
one_check() {
  local name=$1 sha=$2 rps us; shift 2
  evalsha_calls "$port" 50 "$checks" 100000 "$name" "$sha" "$@" >/dev/null
  cli CONFIG RESETSTAT >/dev/null
  rps=$(evalsha_calls "$port" 50 "$checks" 100000 "$name" "$sha" "$@" |
    sed -n 's/.*: \([0-9.]*\) requests per second.*/\1/p')
  us=$(cli INFO commandstats | tr -d '\r' | sed -n 's/^cmdstat_evalsha:.*usec_per_call=\([0-9.]*\).*/\1/p')
  [ -n "$seed_us" ] || seed_us=$us
  us_of[$name]=$us
  echo "$name $rps" >>"$work/ceilings"
  printf '   %-24s %10s calls/s  %6s µs per call  %5.2f × the seed script\n' "$name" "$rps" "$us" \
    "$(ratio "$us" "$seed_us")"
}
each_call "$port" one_check
log_target us_of µs
cli FLUSHALL >/dev/null

echo "== sluice redis backend: 64 checks in flight, 100,000 keys, $checks checks per script"
"$bench" --address "127.0.0.1:$port" --inflight 64 --keys 100000 --checks "$checks" | tee "$work/batched"
echo "== the same, every check its own call (--max-batch 1)"
"$bench" --address "127.0.0.1:$port" --inflight 64 --keys 100000 --checks "$checks" --max-batch 1 | tee "$work/alone"
echo "== checks/s batched, beside every check its own call and beside redis-benchmark's one-check ceiling (step 2)"
awk 'FILENAME ~ /ceilings$/ { ceiling[$1] = $2; next }
     FILENAME ~ /alone$/ && FNR > 1 { alone[$1] = $2; next }
     FILENAME ~ /batched$/ && FNR > 1 && ($1 in ceiling) {
       printf "   %-24s %8d batched  %5.2f × one check a call  %5.2f × redis-benchmark\n", $1, $2, $2 / alone[$1], $2 / ceiling[$1]
     }' "$work/ceilings" "$work/alone" "$work/batched"

# 4. The same one-check calls under callgrind: the instructions Redis runs inside EVALSHA per call
# (3,000 calls over 2,000 keys each), which this noisy machine does not move.
command -v valgrind >/dev/null || { echo "== (valgrind not installed: no instruction counts)"; exit 0; }
vport=$(free_port)
start_redis "$vport" valgrind-redis valgrind --tool=callgrind --toggle-collect=evalShaCommand --callgrind-out-file="$work/cg.out"
vpid=${pids[-1]}
echo "== one check a call under callgrind: instructions inside EVALSHA per call, 3,000 calls over 2,000 keys"
seed_ir=
dumps=0
instructions() {
  local name=$1 sha=$2 n ir; shift 2
  callgrind_control -z "$vpid" >/dev/null 2>&1
  evalsha_calls "$vport" 4 3000 2000 "$name" "$sha" "$@" >/dev/null
  n=$(redis-cli -p "$vport" INFO commandstats | tr -d '\r' | sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\),.*/\1/p')
  callgrind_control -d "$vpid" >/dev/null 2>&1
  dumps=$((dumps + 1))
  ir=$(sed -n 's/^summary: //p' "$work/cg.out.$dumps")
  [ -n "$seed_ir" ] || seed_ir=$((ir / n))
  ir_of[$name]=$((ir / n))
  printf '   %-24s %8d instructions per call  %5.2f × the seed script\n' "$name" $((ir / n)) \
    "$(ratio $((ir / n)) "$seed_ir")"
}
each_call "$vport" instructions
log_target ir_of instructions

# 5. All the instructions of a redis-server (its reading of calls and writing of replies too), per
# check, one check a call beside batches, on the same work: 10,000 checks over 1,000 keys (one in
# ten makes its key). The scripts are loaded first, so that neither count holds their compiling.
wport=$(free_port)
start_redis "$wport" whole-redis valgrind --tool=callgrind --callgrind-out-file="$work/whole.out"
wpid=${pids[-1]}
"$bench" --address "127.0.0.1:$wport" --keys 1 --checks 1 --only token_bucket >/dev/null  # loads every script
echo "== the whole redis-server under callgrind: instructions per check, one check a call and batched"
whole_dumps=0
# Dumps the instructions counted since the last zeroing into $whole_ir.
whole_dump() {
  callgrind_control -d "$wpid" >/dev/null 2>&1
  whole_dumps=$((whole_dumps + 1))
  whole_ir=$(sed -n 's/^summary: //p' "$work/whole.out.$whole_dumps")
}
alone_and_batched() {
  local name=$1 sha=$2 alone batched failed; shift 2
  case $name in seed | TIME*) return ;; esac
  callgrind_control -z "$wpid" >/dev/null 2>&1
  evalsha_calls "$wport" 4 10000 1000 "$name" "$sha" "$@" >/dev/null
  whole_dump
  alone=$((whole_ir / 10000))
  redis-cli -p "$wport" FLUSHALL >/dev/null
  callgrind_control -z "$wpid" >/dev/null 2>&1
  "$bench" --address "127.0.0.1:$wport" --inflight 64 --keys 1000 --checks 9000 --only "$name" >"$work/whole-batched"
  whole_dump
  batched=$((whole_ir / 10000))
  failed=$(awk 'NR == 2 { print $NF }' "$work/whole-batched")
  [ "$failed" = 0 ] || { echo "run.sh: $failed checks failed under callgrind" >&2; exit 1; }
  printf '   %-24s %8d alone  %8d batched  %5.2f × alone\n' "$name" "$alone" "$batched" "$(ratio "$batched" "$alone")"
}
each_call "$wport" alone_and_batched
