#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The Redis Cluster backend beside the single-Redis one, in one run, on servers of its own.
#
#   bench/redis/cluster.sh [path/to/redis_benchmark]      (default: build/bench/redis_benchmark)
#
# 1. starts one redis-server and a 3-master Redis Cluster (no replicas: on this machine their
#    replication would take CPU from the masters) on free 127.0.0.1 ports, no persistence;
# 2. runs redis_benchmark (over 100,000 keys, every script) on the single Redis, then on the
#    cluster, twice in turn: checks/s, latency, this client's CPU per check, and the server time per
#    call on each master (the spread shows how evenly the keys are balanced). Each pair runs twice:
#    as users run it (64 checks in flight, batching on: on one Redis the checks waiting share calls,
#    on a cluster only those of one slot can), and with every check its own call (max_batch 1) and
#    as many in flight per connection (22 on one Redis beside 64 over three masters), which isolates
#    what routing costs from what smaller batches per connection cost in system calls;
# then stops the servers it started (by their PIDs). Every loop is bounded.
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench/lib.sh

bench=${1:-build/bench/redis_benchmark}
checks=${CHECKS:-200000}
[ -x "$bench" ] || { echo "cluster.sh: $bench not built (cmake --build build --target redis_benchmark)" >&2; exit 1; }

# A free port whose cluster bus port (port + 10000) is free too.
cluster_port() {
  while :; do
    local p
    p=$(free_port)
    if [ $((p + 10000)) -le 65535 ] && python3 -c "import socket,sys; s=socket.socket(); s.bind(('127.0.0.1',$((p + 10000))))" 2>/dev/null; then
      echo "$p"
      return
    fi
  done
}

start_redis() {  # start_redis PORT [args...]
  local port=$1
  shift
  mkdir -p "$work/$port"
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work/$port" --daemonize no \
    --logfile "$work/$port/redis.log" "$@" &
  pids+=($!)
  for _ in $(seq 1 100); do redis-cli -p "$port" PING >/dev/null 2>&1 && return 0; sleep 0.05; done
  echo "redis-server on $port did not answer" >&2
  return 1
}

single=$(free_port)
start_redis "$single"
masters=()
for _ in 1 2 3; do
  p=$(cluster_port)
  start_redis "$p" --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 1000
  masters+=("127.0.0.1:$p")
done
redis-cli --cluster create "${masters[@]}" --cluster-yes >/dev/null
for _ in $(seq 1 600); do
  ok=1
  for m in "${masters[@]}"; do
    redis-cli -p "${m##*:}" CLUSTER INFO | grep -q cluster_state:ok || ok=0
  done
  [ "$ok" = 1 ] && break
  sleep 0.1
done
seeds=$(IFS=,; echo "${masters[*]}")

echo "== redis-server $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p'), $(nproc) cores; 100,000 keys, $checks checks per script"
for run in 1 2; do
  echo "== run $run: one Redis (127.0.0.1:$single), 64 in flight"
  "$bench" --address "127.0.0.1:$single" --inflight 64 --keys 100000 --checks "$checks"
  echo "== run $run: Redis Cluster, 3 masters ($seeds), 64 in flight; usec_per_call per master"
  "$bench" --cluster "$seeds" --inflight 64 --keys 100000 --checks "$checks"
  echo "== run $run: one Redis, 22 in flight (as many per connection as the cluster's 64 over 3 masters), max_batch 1"
  "$bench" --address "127.0.0.1:$single" --inflight 22 --keys 100000 --checks "$checks" --max-batch 1
  echo "== run $run: Redis Cluster, 64 in flight, max_batch 1"
  "$bench" --cluster "$seeds" --inflight 64 --keys 100000 --checks "$checks" --max-batch 1
done
