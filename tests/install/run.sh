#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs the build tree into a temporary prefix, then configures, builds and runs against it with
# find_package(sluice): tests/install/consumer (the limiters), and, when sluice::rules is installed,
# tests/install/rules_consumer (rules from a real etcd, started here on 127.0.0.1).
set -euo pipefail
build_dir=$1
source_dir=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
etcd_pid=""
cleanup() {
  if [ -n "$etcd_pid" ]; then
    kill "$etcd_pid" 2>/dev/null || true
    wait "$etcd_pid" 2>/dev/null || true  # its exit status is SIGTERM's
  fi
  rm -rf "$work"
}
trap cleanup EXIT
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
grep -q 'Apache License' "$work/prefix/share/doc/sluice/LICENSE" || { echo "the licence is not installed"; exit 1; }
cmake -S "$source_dir/consumer" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build" >/dev/null
"$work/build/consumer"

# Rules from etcd: when sluice::rules and sluice::etcd are installed and etcd is on this machine.
targets=$(find "$work/prefix" -name 'sluice-targets.cmake' | head -n 1)
grep -q 'sluice::rules' "$targets" && grep -q 'sluice::etcd' "$targets" || exit 0
command -v etcd >/dev/null && command -v etcdctl >/dev/null || exit 0
cmake -S "$source_dir/rules_consumer" -B "$work/rules_build" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/rules_build" >/dev/null
read -r client peer < <(python3 -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1", 0)) for x in s]
print(*[x.getsockname()[1] for x in s])')
endpoint="127.0.0.1:$client"
etcd --name consumer --data-dir "$work/etcd" --listen-client-urls "http://$endpoint" \
  --advertise-client-urls "http://$endpoint" --listen-peer-urls "http://127.0.0.1:$peer" \
  --initial-advertise-peer-urls "http://127.0.0.1:$peer" --initial-cluster "consumer=http://127.0.0.1:$peer" \
  --log-level warn >"$work/etcd.log" 2>&1 &
etcd_pid=$!
for _ in $(seq 100); do
  ETCDCTL_API=3 etcdctl --endpoints="$endpoint" put /sluice/rules/api \
    '{"algorithm":"fixed_window","limit":2,"window":"60s"}' >/dev/null 2>&1 && break
  sleep 0.1
done
"$work/rules_build/rules_consumer" "$endpoint"
