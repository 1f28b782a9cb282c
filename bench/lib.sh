# SPDX-License-Identifier: Apache-2.0
# Sourced by the bench/*/run.sh harnesses that start servers: a work directory, the PIDs of the
# processes started (ended at exit, those only), a free loopback port, waits for HTTP and Redis, and
# a redis-server of the harness's own.
work="$(mktemp -d)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() {  # wait_http URL [SECONDS] [-f]: until it answers (-f: with 2xx), at most SECONDS (10)
  for _ in $(seq 1 $((${2:-10} * 20))); do
    curl -s ${3:-} -o /dev/null "$1" && return 0
    sleep 0.05
  done
  echo "nothing answers at $1" >&2
  return 1
}
wait_ok() { wait_http "$1" "${2:-10}" -f; }  # wait_ok URL [SECONDS]: until it answers 2xx (sluiced's /readyz)
wait_redis() {  # wait_redis PORT [SECONDS]: until a redis-server answers PING there, at most SECONDS (10)
  for _ in $(seq 1 $((${2:-10} * 20))); do
    redis-cli -p "$1" PING >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  echo "no redis-server answers on port $1" >&2
  return 1
}
# start_redis PORT NAME [COMMAND...]: a redis-server of its own on 127.0.0.1:PORT, without
# persistence, logging to $work/NAME.log, run by COMMAND (valgrind) when one is given; waits until
# it answers (10 s, or 30 under a COMMAND). Its PID is the last of `pids`.
start_redis() {
  local p=$1 name=$2
  shift 2
  "$@" redis-server --port "$p" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" --daemonize no \
    --logfile "$work/$name.log" >/dev/null 2>&1 &
  pids+=($!)
  wait_redis "$p" $(($# > 0 ? 30 : 10))
}
