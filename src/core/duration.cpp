// SPDX-License-Identifier: Apache-2.0
#include "sluice/duration.hpp"

#include <charconv>
#include <limits>
#include <string>

namespace sluice {

result<nanoseconds> parse_duration(std::string_view text) {
  auto fail = [&] {
    return error(errc::config_invalid, "must be a duration like \"250ms\", \"60s\", \"5m\", \"1h\" or \"1d\", got \"" +
                                           std::string(text) + "\"");
  };
  std::size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0 || digits > 12) return fail();
  std::int64_t n = 0;
  std::from_chars(text.data(), text.data() + digits, n);
  std::string_view unit = text.substr(digits);
  std::int64_t scale = 0;
  if (unit == "ms") {
    scale = 1'000'000;
  } else if (unit == "s") {
    scale = 1'000'000'000;
  } else if (unit == "m") {
    scale = 60'000'000'000;
  } else if (unit == "h") {
    scale = 3'600'000'000'000;
  } else if (unit == "d") {
    scale = 86'400'000'000'000;
  } else {
    return fail();
  }
  if (n > std::numeric_limits<std::int64_t>::max() / scale) return fail();
  return nanoseconds(n * scale);
}

}  // namespace sluice
