// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: envoyproxy/ratelimit YAML files (with sluice's extensions) through the Envoy
// API's domain loader. Any file must give a domain or an error that names the file: no crash, no
// UB, bounded time and memory (aliases included: yaml-cpp shares an aliased node, the loader walks
// it once per use, and the descriptors of a domain are bounded).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "envoy/domain_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto d = sluice::envoy::parse_domain(text, "fuzz.yaml");
  if (!d && d.error().message.rfind("fuzz.yaml", 0) != 0) std::abort();  // an error says which file
  return 0;
}
