#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds sluiced's libFuzzer targets with clang (-fsanitize=fuzzer,address,undefined) and runs each
# briefly on its seed corpus. Independent of the CMake build.
#
#   fuzz/run.sh [OUT_DIR] [SECONDS_PER_TARGET]      # defaults: build-fuzz, 20
#
# Exits non-zero when a target fails to build or finds a crash (the reproducer is left in OUT_DIR).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/build-fuzz}"
seconds="${2:-20}"
cxx="${CLANGXX:-clang++}"
launcher=()
command -v ccache >/dev/null && launcher=(ccache)
mkdir -p "$out"

flags=(-std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -I"$root/include" -I"$root/src")
# The library code the targets reach: the config loader, the request parser and the core it uses,
# the memory backend its checks are validated on, the HTTP fields its answers share with the
# middleware, the Redis backend's commands and reply parsers, and the Envoy API's YAML loader.
lib=("$root"/src/core/*.cpp "$root"/src/keyed/*.cpp "$root/src/rules/config.cpp" "$root/src/server/api.cpp"
     "$root/src/http/headers.cpp"
     "$root"/src/redis/{command,reply_bounds,exactness,keys,scripts,slot}.cpp "$root/src/envoy/domain_config.cpp")

objdir="$out/obj"
mkdir -p "$objdir"
objs=()
for src in "${lib[@]}"; do
  obj="$objdir/$(basename "${src%.cpp}").o"
  # Compiled every time (ccache makes that cheap): a source's mtime says nothing of its headers'.
  echo "fuzz: compiling $(basename "$src")"
  # -fsanitize=fuzzer-no-link: instrument library code without a second main().
  "${launcher[@]}" "$cxx" "${flags[@]/-fsanitize=fuzzer,address,undefined/-fsanitize=fuzzer-no-link,address,undefined}" -c "$src" -o "$obj"
  objs+=("$obj")
done

status=0
for target in fuzz_check_body fuzz_config fuzz_http_request fuzz_redis_reply fuzz_envoy_config; do
  corpus_seed="$root/fuzz/corpus/${target#fuzz_}"
  work="$out/$target-corpus"
  mkdir -p "$work"
  echo "fuzz: building $target"
  # Beast as sluiced ships it (NDEBUG builds): Boost 1.74's basic_parser asserts n >= 5 where 4
  # bytes (a final chunk split after its first trailer byte) are valid and parse correctly.
  target_flags=()
  [ "$target" = fuzz_http_request ] && target_flags=(-DBOOST_DISABLE_ASSERTS)
  "${launcher[@]}" "$cxx" "${flags[@]}" "${target_flags[@]}" "$root/fuzz/$target.cpp" "${objs[@]}" -lhiredis -lyaml-cpp -o "$out/$target"
  echo "fuzz: running $target for ${seconds}s"
  if ! (cd "$out" && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        "./$target" -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -print_final_stats=1 \
        "$work" "$corpus_seed" 2>&1 | tail -n 25); then
    echo "fuzz: $target FAILED"
    status=1
  fi
done
exit $status
