// SPDX-License-Identifier: Apache-2.0
// Embeds sluice: rules from etcd (etcd_rule_source), checks through them on a memory backend.
//
//   rules_consumer ENDPOINT      # etcd holds /sluice/rules/api = {"algorithm":"fixed_window","limit":2,...}
//
// The default rule "api" admits 100 a minute; etcd's admits 2. Exits 0 when etcd's rule is in force
// and decides: 2 admitted, the third refused.
#include <sluice/memory_backend.hpp>
#include <sluice/server/etcd_rule_source.hpp>

#include <chrono>
#include <cstdio>
#include <thread>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  using namespace std::chrono_literals;
  auto backend = sluice::make_memory_backend({}).value();
  std::vector<sluice::rule> defaults{{.name = "api", .limit = sluice::fixed_window_policy(100, 60s)}};
  auto source = sluice::server::etcd_rule_source::start({.enabled = true, .options = {.endpoints = {argv[1]}}},
                                                        *backend, defaults, {});
  if (!source) {
    std::fprintf(stderr, "etcd_rule_source: %s\n", source.error().message.c_str());
    return 1;
  }
  // etcd answers within a second or so; wait for its version of the rule, at most 20 s.
  const auto give_up = std::chrono::steady_clock::now() + 20s;
  while ((*source)->current()->find("api")->definition().limit.limit != 2) {
    if (std::chrono::steady_clock::now() > give_up) {
      std::fprintf(stderr, "etcd's rule never came into force\n");
      return 1;
    }
    std::this_thread::sleep_for(50ms);
  }
  int admitted = 0;
  for (int i = 0; i < 3; ++i) {
    std::shared_ptr<const sluice::rule_set> rules = (*source)->current();
    auto d = backend->check({.rule = rules->find("api"), .key = "user:42"});
    if (!d) {
      std::fprintf(stderr, "check: %s\n", d.error().message.c_str());
      return 1;
    }
    admitted += d->allowed;
  }
  std::printf("rules from etcd (version %llu): admitted %d of 3\n",
              static_cast<unsigned long long>((*source)->current()->version()), admitted);
  return admitted == 2 ? 0 : 1;
}
