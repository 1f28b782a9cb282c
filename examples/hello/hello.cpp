// SPDX-License-Identifier: Apache-2.0
#include <sluice/memory_backend.hpp>
#include <sluice/version.hpp>

#include <chrono>
#include <cstdio>
#include <string_view>

// 5 requests a second per key, in bursts of up to 60: the 61st in a row is refused.
int main(int argc, char** argv) {
  if (argc > 1) {  // --help, --version: what this is; anything else is not understood
    std::printf("hello (sluice %s): 61 checks of one key under 5/s, bursts of 60\n", sluice::version);
    const std::string_view arg = argv[1];
    return arg == "--help" || arg == "--version" ? 0 : 2;
  }
  auto backend = sluice::make_memory_backend({}).value();  // or make_redis_backend, make_redis_cluster_backend
  sluice::rule api{.name = "api", .limit = sluice::token_bucket_policy(sluice::per_second(5), 60)};
  auto prepared = backend->prepare(api);  // once: errors name the bad parameter
  if (!prepared) {
    std::fprintf(stderr, "%s\n", prepared.error().message.c_str());  // e.g. "burst must be >= 0, got -1"
    return 1;
  }
  for (int i = 1; i <= 61; ++i) {
    sluice::result<sluice::decision> d = backend->check({.rule = prepared->get(), .key = "user:42"});
    if (!d) return 1;  // a backend error (none in process)
    if (!d->allowed) {
      const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(d->retry_after);
      std::printf("request %d refused: retry in %lld ms (limit %lld, remaining %lld)\n", i,
                  static_cast<long long>(wait.count()), static_cast<long long>(d->limit),
                  static_cast<long long>(d->remaining));
      return 0;
    }
  }
  return 1;
}
