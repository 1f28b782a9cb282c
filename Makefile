# The commands a user runs. Each one installs what is missing (scripts/deps) and builds first.
JOBS ?= $(shell nproc)
BUILD := cmake --build
# ccache hits across clones of the repository in other folders (CI builds a fresh clone).
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := 1

.PHONY: all deps build run test test-asan test-tsan test-release bench bench-peers package clean

all: build

deps:
	@scripts/deps

build: deps
	cmake --preset release >/dev/null
	$(BUILD) build -j$(JOBS)

run: build
	./build/tools/sluice-demo

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

# The core benchmarks next to Go's golang.org/x/time/rate (installs golang-go when missing).
bench-peers: build
	bench/peers/run.sh

package: build
	cd build && cpack -G DEB

clean:
	rm -rf build build-asan build-tsan build-debug
