// SPDX-License-Identifier: Apache-2.0
#include "server/log_format.hpp"

#include <spdlog/pattern_formatter.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>

namespace sluice::server {
namespace {

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// A quoted value from `at` (its opening quote) to its closing one; `at` is left past it.
std::string unquote(std::string_view line, std::size_t& at) {
  std::string out;
  for (++at; at < line.size() && line[at] != '"'; ++at) {
    if (line[at] != '\\' || at + 1 == line.size()) {
      out += line[at];
      continue;
    }
    const char next = line[++at];
    if (next == 'x' && at + 2 < line.size() && hex_digit(line[at + 1]) >= 0 && hex_digit(line[at + 2]) >= 0) {
      out += static_cast<char>(hex_digit(line[at + 1]) * 16 + hex_digit(line[at + 2]));
      at += 2;
    } else {
      out += next;
    }
  }
  if (at < line.size()) ++at;  // the closing quote
  return out;
}

// JSON lines: the time in UTC with milliseconds, the level's name, then the message's fields.
class json_formatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    using namespace std::chrono;
    const auto ms = duration_cast<milliseconds>(msg.time.time_since_epoch()).count();
    const std::time_t seconds = static_cast<std::time_t>(ms / 1000);
    std::tm utc{};
    ::gmtime_r(&seconds, &utc);
    char time[40];
    const std::size_t n = std::strftime(time, sizeof time, "%Y-%m-%dT%H:%M:%S", &utc);
    std::snprintf(time + n, sizeof time - n, ".%03dZ", static_cast<int>(ms % 1000));
    const auto level = spdlog::level::to_string_view(msg.level);
    const std::string line = json_line(time, std::string_view(level.data(), level.size()),
                                       std::string_view(msg.payload.data(), msg.payload.size()));
    dest.append(line.data(), line.data() + line.size());
    dest.push_back('\n');
  }
  std::unique_ptr<spdlog::formatter> clone() const override { return std::make_unique<json_formatter>(); }
};

}  // namespace

std::vector<std::pair<std::string, std::string>> logfmt_fields(std::string_view line) {
  std::vector<std::pair<std::string, std::string>> fields;
  std::string message;
  for (std::size_t at = 0; at < line.size();) {
    if (line[at] == ' ') {
      ++at;
      continue;
    }
    const std::size_t end = line.find(' ', at);
    const std::size_t eq = line.find('=', at);
    if (eq == std::string_view::npos || (end != std::string_view::npos && eq > end) || eq == at) {
      const std::size_t stop = end == std::string_view::npos ? line.size() : end;
      if (!message.empty()) message += ' ';
      message.append(line.substr(at, stop - at));
      at = stop;
      continue;
    }
    std::string key(line.substr(at, eq - at));
    at = eq + 1;
    if (at < line.size() && line[at] == '"') {
      fields.emplace_back(std::move(key), unquote(line, at));
      continue;
    }
    const std::size_t stop = line.find(' ', at);
    fields.emplace_back(std::move(key), std::string(line.substr(
                                            at, stop == std::string_view::npos ? std::string_view::npos : stop - at)));
    at = stop == std::string_view::npos ? line.size() : stop;
  }
  if (!message.empty()) fields.emplace_back("message", std::move(message));
  return fields;
}

std::string json_line(std::string_view time, std::string_view level, std::string_view line) {
  // Keys in the order written (nlohmann's ordered_json), invalid UTF-8 replaced rather than thrown.
  nlohmann::ordered_json j;
  j["time"] = time;
  j["level"] = level;
  for (auto& [k, v] : logfmt_fields(line)) j[k] = std::move(v);
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void apply_log_settings(const log_settings& s) {
  spdlog::set_level(spdlog::level::from_str(s.level));
  if (s.format == "json") {
    spdlog::set_formatter(std::make_unique<json_formatter>());
  } else {
    spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e%z level=%l %v");
  }
}

}  // namespace sluice::server
