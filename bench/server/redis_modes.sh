#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# sluiced on one redis-server reached three ways, in turn, in the same run: plaintext, TLS, and
# through Redis Sentinel (one sentinel watching that server as its master).
#
# One redis-server with a plaintext port and a TLS port (a CA and a server certificate made here
# with the openssl CLI). For each round and each way: a sluiced of its own, wrk (64 connections,
# ids over 100,000 keys) on a sliding-window-log rule for DURATION, and sluiced's CPU per request
# (user + system time of the process over the run, from /proc). Prints each figure, and TLS's and
# Sentinel's requests/s as a share of plaintext's in the same round.
#
#   bench/server/redis_modes.sh [SLUICED]      # default: build/src/server/sluiced (a Release build)
#   ROUNDS=2 DURATION=10s CONNECTIONS=64 WRK_THREADS=2 bench/server/redis_modes.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
sluiced="${1:-$root/build/src/server/sluiced}"
rounds="${ROUNDS:-2}"
duration="${DURATION:-10s}"
connections="${CONNECTIONS:-64}"
wrk_threads="${WRK_THREADS:-2}"
[ -x "$sluiced" ] || { echo "no sluiced at $sluiced (build it first: make build)" >&2; exit 1; }
for tool in wrk redis-server redis-sentinel openssl python3 curl; do
  command -v "$tool" >/dev/null || { echo "$tool is required (scripts/deps installs it)" >&2; exit 1; }
done

source "$here/../lib.sh"
hz="$(getconf CLK_TCK)"
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }  # user + system

# --- the server: plaintext and TLS ports -----------------------------------------------------------
(
  cd "$work"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=bench-ca
  openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=127.0.0.1
  printf 'subjectAltName = IP:127.0.0.1\n' >san.cnf
  openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile san.cnf -out server.crt
) >/dev/null 2>&1
rport="$(free_port)"
tport="$(free_port)"
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" --logfile "$work/redis.log" \
  --tls-port "$tport" --tls-cert-file "$work/server.crt" --tls-key-file "$work/server.key" \
  --tls-ca-cert-file "$work/ca.crt" --tls-auth-clients no >/dev/null 2>&1 &
pids+=($!)
wait_redis "$rport"

# --- one sentinel watching it ----------------------------------------------------------------------
sport="$(free_port)"
printf 'port %s\nbind 127.0.0.1\ndir %s\nsentinel monitor bench 127.0.0.1 %s 1\n' "$sport" "$work" "$rport" \
  >"$work/sentinel.conf"
redis-sentinel "$work/sentinel.conf" --logfile "$work/sentinel.log" >/dev/null 2>&1 &
pids+=($!)
wait_redis "$sport"

rule='[[rules]]
name = "bench_window"
algorithm = "sliding_window"
limit = 1000
window = "60s"'

backend_of() {  # the [backend] table of a way
  case "$1" in
    plaintext) printf 'type = "redis"\naddresses = ["127.0.0.1:%s"]\n' "$rport" ;;
    tls) printf 'type = "redis"\naddresses = ["127.0.0.1:%s"]\ntls = true\ntls_ca_file = "%s"\n' "$tport" "$work/ca.crt" ;;
    sentinel) printf 'type = "redis_sentinel"\nsentinels = ["127.0.0.1:%s"]\nmaster_name = "bench"\n' "$sport" ;;
  esac
}

results=()
for round in $(seq 1 "$rounds"); do
  for way in plaintext tls sentinel; do
    port="$(free_port)"
    printf '[server]\nlisten = "127.0.0.1:%s"\n[backend]\n%s\ntimeout_ms = 200\n%s\n' "$port" "$(backend_of "$way")" \
      "$rule" >"$work/$way.toml"
    "$sluiced" --config "$work/$way.toml" 2>"$work/sluiced-$way.log" &
    pids+=($!)
    pid="${pids[-1]}"
    wait_http "http://127.0.0.1:$port/healthz" || { cat "$work/sluiced-$way.log" >&2; exit 1; }
    for _ in $(seq 1 200); do  # until the backend is connected (the sentinel asked, TLS made)
      [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/readyz")" = 200 ] && break
      sleep 0.05
    done
    redis-cli -p "$rport" FLUSHALL >/dev/null
    t0="$(cpu_ticks "$pid")"
    out="$(RULE=bench_window wrk -t"$wrk_threads" -c"$connections" -d"$duration" -s "$here/check.lua" \
      "http://127.0.0.1:$port")"
    ticks=$(($(cpu_ticks "$pid") - t0))
    if curl -s "http://127.0.0.1:$port/metrics" | grep -Eq '^sluice_redis_(timeouts|unavailable|protocol_errors|overloaded)_total [1-9]'; then
      echo "warning: some checks of the $way run were not decided by Redis" >&2
    fi
    kill "$pid"; wait "$pid" || true
    rps="$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")"
    requests="$(awk '/requests in/ {print $1}' <<<"$out")"
    cpu_us="$(awk -v t="$ticks" -v hz="$hz" -v n="$requests" 'BEGIN { printf "%.1f", t / hz * 1e6 / n }')"
    results+=("$round|$way|$rps|$cpu_us")
  done
done

echo
echo "wrk -t$wrk_threads -c$connections -d$duration, sliding-window-log rule, ids over 100,000 keys, $(nproc) cores"
printf '%-6s %-10s %12s %18s %14s\n' round way requests/s "sluiced CPU µs/req" "x plaintext"
for r in "${results[@]}"; do
  IFS='|' read -r round way rps cpu_us <<<"$r"
  [ "$way" = plaintext ] && base="$rps"
  printf '%-6s %-10s %12s %18s %14s\n' "$round" "$way" "$rps" "$cpu_us" \
    "$(awk -v a="$rps" -v b="$base" 'BEGIN { printf "%.2f", a / b }')"
done
