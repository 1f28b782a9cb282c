// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: POST /v1/check bodies through the request parser and the reply renderer.
// Any input must give either a parsed batch or an api_error: no crash, no UB, bounded memory.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <variant>

#include "sluice/memory_backend.hpp"
#include "sluice/rule_set.hpp"
#include "server/api.hpp"
#include "sluice/server/config.hpp"

namespace {

// The config's rules prepared on a memory backend, as sluiced holds them.
struct fuzz_rules {
  std::unique_ptr<sluice::memory_backend> backend;
  std::shared_ptr<const sluice::rule_set> rules;
};

const fuzz_rules& fuzz_config() {
  static const fuzz_rules made = [] {
    auto c = sluice::server::parse_config(R"(
[ratelimit]
algorithm = "token_bucket"
token_rate = 10
token_burst = 20
[[rules]]
name = "ai"
algorithm = "sliding_window"
limit = 100
window = "60s"
[[rules]]
name = "t"
algorithm = "sliding_window"
window = "60s"
tenant_limit = 1000
user_limit = 100
)",
                                          "fuzz.toml");
    if (!c) std::abort();
    fuzz_rules out{.backend = sluice::make_memory_backend({}).value()};
    out.rules = sluice::rule_set::build(*out.backend, c->rules, {}, nullptr).value();
    return out;
  }();
  return made;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view body(reinterpret_cast<const char*>(data), size);
  const fuzz_rules& f = fuzz_config();
  auto parsed = sluice::server::parse_check_body(body, *f.rules);
  if (auto* e = std::get_if<sluice::server::api_error>(&parsed)) {
    if (e->status != 400 && e->status != 404 && e->status != 413) std::abort();
    (void)sluice::server::render_error(*e);
    return 0;
  }
  const auto& batch = std::get<sluice::server::check_batch>(parsed);
  if (batch.items.empty() || batch.items.size() > sluice::server::max_batch_checks) std::abort();
  for (const auto& item : batch.items) {
    if (item.error) {
      (void)sluice::server::render_error(*item.error);
      continue;
    }
    // Whatever passed the parser is valid, or refused by the check's validation as the caller's fault.
    auto valid = sluice::validate(item.request(), *f.backend);
    if (!valid && valid.error().code != sluice::condition::invalid_request) std::abort();
    if (!valid) (void)sluice::server::render_error(sluice::server::api_error_of(valid.error()));
    (void)sluice::server::render_decision(*item.rule, sluice::server::disabled_decision(*item.rule));
  }
  return 0;
}
