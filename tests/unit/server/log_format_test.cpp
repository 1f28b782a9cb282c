// SPDX-License-Identifier: Apache-2.0
// sluiced's log lines in JSON: the key=value fields of a line as log_value writes them, values
// unquoted exactly, in order, and a hostile value kept inside its field.
#include "server/log_format.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/log_value.hpp"

namespace sluice::server {
namespace {

using fields = std::vector<std::pair<std::string, std::string>>;

TEST(LogFormat, FieldsAsLogValueWritesThem) {
  EXPECT_EQ(logfmt_fields("event=start version=0.1.0 config=/etc/sluice/sluice.toml"),
            (fields{{"event", "start"}, {"version", "0.1.0"}, {"config", "/etc/sluice/sluice.toml"}}));
  // Every value log_value can write comes back as it was: spaces, quotes, '=', backslashes, bytes.
  const std::vector<std::string> values{"a b", "say \"hi\"", "k=v", "back\\slash", std::string("nl\nnul\0end", 11), ""};
  for (const std::string& v : values) {
    const std::string line = "event=check key=" + log_value(v) + " rule=api";
    EXPECT_EQ(logfmt_fields(line), (fields{{"event", "check"}, {"key", v}, {"rule", "api"}})) << line;
  }
  // A word that is not key=value is kept, as the message.
  EXPECT_EQ(logfmt_fields("event=x loose words"), (fields{{"event", "x"}, {"message", "loose words"}}));
}

TEST(LogFormat, AJsonLineHasTimeLevelAndTheFieldsInOrder) {
  const std::string line = json_line("2026-12-05T17:00:00.123Z", "warn",
                                     "event=redis_circuit_open address=10.0.0.1:6379 reason=\"3 failures\"");
  EXPECT_EQ(
      line,
      R"({"time":"2026-12-05T17:00:00.123Z","level":"warn","event":"redis_circuit_open","address":"10.0.0.1:6379",)"
      R"("reason":"3 failures"})");
  // Bytes that are not UTF-8 do not break the line.
  const auto parsed = nlohmann::json::parse(json_line("t", "info", "event=check key=" + log_value("\xff\xfe")));
  EXPECT_EQ(parsed["event"], "check");
}

}  // namespace
}  // namespace sluice::server
