# SPDX-License-Identifier: Apache-2.0
# The commands a user runs. Each one installs what is missing (scripts/deps) and builds first.
JOBS ?= $(shell nproc)
BUILD := cmake --build
# ccache hits across clones of the repository in other folders (CI builds a fresh clone).
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1

.PHONY: all deps build build-run run test test-asan test-tsan test-release bench bench-peers package clean

all: build

deps:
	@scripts/deps

build: deps
	cmake --preset release >/dev/null
	$(BUILD) build -j$(JOBS)

# Only what `make run` starts, so the first run does not wait for the tests and benchmarks.
build-run: deps
	cmake --preset release >/dev/null
	$(BUILD) build -j$(JOBS) --target sluiced sluice_tool

# sluiced on 127.0.0.1:8080 with the in-process backend: nothing else to start.
run: build-run
	@echo "sluiced on http://127.0.0.1:8080 (Ctrl-C stops). Try:"
	@echo "  curl -si --json '{\"rule\":\"api\",\"key\":\"user:7\"}' http://127.0.0.1:8080/v1/check"
	@echo "  curl -s --json '{\"rule\":\"api\",\"key\":\"user:42\"}' http://127.0.0.1:8080/v1/check    # an override"
	@echo "  curl -s --json '{\"rule\":\"tenant_api\",\"tenant\":\"globex\",\"user\":\"bob\"}' http://127.0.0.1:8080/v1/check"
	@echo "  curl -s --json '{\"checks\":[{\"key\":\"a\"},{\"rule\":\"ai\",\"key\":\"b\",\"cost\":5}]}' http://127.0.0.1:8080/v1/check"
	@echo "  curl -s http://127.0.0.1:8080/metrics | grep sluice_"
	@echo "  ./build/tools/sluice demo    # the core on simulated time: the r=5/s, b=60 walk-through"
	./build/src/server/sluiced --config examples/sluice.toml

# Unit and integration tests under ASan+UBSan, concurrency tests under TSan, then the release build's
# own tests (install + find_package consumer).
test: deps test-asan test-tsan test-release

test-asan:
	cmake --preset asan >/dev/null
	$(BUILD) build-asan -j$(JOBS)
	cd build-asan && ctest --output-on-failure -j$(JOBS) -LE release_only

test-tsan:
	cmake --preset tsan >/dev/null
	$(BUILD) build-tsan -j$(JOBS) --target concurrency_tests
	cd build-tsan && TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure -j$(JOBS) -L concurrency

test-release: build
	cd build && ctest --output-on-failure -j$(JOBS) -L release_only

bench: build
	./build/bench/core_benchmark --benchmark_min_time=0.2
	bench/redis/run.sh build/bench/redis_benchmark
	bench/redis/cluster.sh build/bench/redis_benchmark
	bench/server/run.sh build/src/server/sluiced
	bench/server/redis_modes.sh build/src/server/sluiced
	bench/http/run.sh build/examples/notes_beast
	bench/etcd/run.sh build/src/server/sluiced
	bench/envoy/run.sh build/src/server/sluiced build/bench/rls_load
	bench/leases/run.sh build/src/server/sluiced

# The core benchmarks next to Go's golang.org/x/time/rate (installs golang-go when missing).
bench-peers: build
	bench/peers/run.sh

package: build
	cd build && cpack -G DEB

clean:
	rm -rf build build-asan build-tsan build-debug
