// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: arbitrary bytes through the TOML config loader. Any input must give a config
// whose rules all validate, or an error whose message starts with the source name.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string_view>

#include "sluice/server/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > 64 * 1024) return 0;  // config files are small; keep each run fast
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto c = sluice::server::parse_config(text, "fuzz.toml");
  if (!c) {
    if (c.error().message.rfind("fuzz.toml", 0) != 0) std::abort();
    return 0;
  }
  std::set<std::string_view> names;
  for (const auto& r : c->rules) {
    if (!sluice::validate(r).ok()) std::abort();
    if (!names.insert(r.name).second) std::abort();  // names are unique
  }
  return 0;
}
