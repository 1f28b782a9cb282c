// SPDX-License-Identifier: Apache-2.0
#include "traffic.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <string>
#include <unordered_map>

#include "sluice/server/config.hpp"

namespace sluice::cli {

namespace {

struct token {
  std::string_view text;
  std::size_t line = 1, column = 1;
};

// Splits into statements of tokens, remembering where each token starts.
std::vector<std::vector<token>> tokenize(std::string_view p) {
  std::vector<std::vector<token>> statements(1);
  std::size_t line = 1, column = 1;
  for (std::size_t i = 0; i < p.size();) {
    const char c = p[i];
    if (c == ';' || c == '\n') {
      statements.emplace_back();
      if (c == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
      ++i;
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\r') {
      ++i;
      ++column;
      continue;
    }
    std::size_t j = i;
    while (j < p.size() && p[j] != ' ' && p[j] != '\t' && p[j] != '\r' && p[j] != ';' && p[j] != '\n') ++j;
    statements.back().push_back({p.substr(i, j - i), line, column});
    column += j - i;
    i = j;
  }
  std::erase_if(statements, [](const auto& s) { return s.empty(); });
  return statements;
}

error at(const token& t, const std::string& what) {
  return error(errc::invalid_argument, std::to_string(t.line) + ":" + std::to_string(t.column) + ": " + what);
}

// A time or duration, at most max_span_ns: sums of them (the cursor) stay far from overflowing.
result<std::int64_t> time_of(const token& t) {
  if (t.text == "0") return std::int64_t{0};
  auto d = parse_duration(t.text);
  if (!d) return at(t, "expected a time like \"30s\" or \"250ms\", got \"" + std::string(t.text) + "\"");
  if (d->count() > max_span_ns) return at(t, "longer than 366d");
  return d->count();
}

// The cursor moved on by `d`, if that stays within max_span_ns.
result<std::int64_t> after(std::int64_t cursor, std::int64_t d, const token& where) {
  if (d > max_span_ns - cursor) return at(where, "goes past 366d");
  return cursor + d;
}

result<std::int64_t> count_of(const token& t) {
  std::int64_t n = 0;
  auto [end, ec] = std::from_chars(t.text.data(), t.text.data() + t.text.size(), n);
  if (ec != std::errc() || end != t.text.data() + t.text.size() || n < 0) {
    return at(t, "expected a number of requests, got \"" + std::string(t.text) + "\"");
  }
  return n;
}

// "10/s" → 10 requests a second.
result<double> rate_of(const token& t) {
  if (!t.text.ends_with("/s")) return at(t, "expected a rate like \"10/s\", got \"" + std::string(t.text) + "\"");
  const std::string_view n = t.text.substr(0, t.text.size() - 2);
  double r = 0;
  auto [end, ec] = std::from_chars(n.data(), n.data() + n.size(), r);
  if (ec != std::errc() || end != n.data() + n.size() || !(r > 0) || !std::isfinite(r)) {
    return at(t, "expected a rate > 0 like \"10/s\", got \"" + std::string(t.text) + "\"");
  }
  return r;
}

}  // namespace

result<std::vector<std::int64_t>> parse_traffic(std::string_view pattern, std::int64_t* end_ns) {
  std::vector<std::int64_t> times;
  std::int64_t cursor = 0, end = 0;  // end: how far the pattern reaches, a trailing idle included
  auto add = [&](std::int64_t t, const token& where) -> result<void> {
    if (times.size() >= max_requests) return at(where, "more than " + std::to_string(max_requests) + " requests");
    times.push_back(t);
    return {};
  };
  for (const auto& s : tokenize(pattern)) {
    const token& verb = s[0];
    auto expect = [&](std::size_t i, std::string_view word) -> result<void> {
      if (i >= s.size()) return at(s.back(), "expected \"" + std::string(word) + "\" after this");
      if (s[i].text != word)
        return at(s[i], "expected \"" + std::string(word) + "\", got \"" + std::string(s[i].text) + "\"");
      return {};
    };
    if (verb.text == "burst") {
      if (s.size() < 2) return at(verb, "burst needs a number of requests");
      auto n = count_of(s[1]);
      if (!n) return n.error();
      if (s.size() > 2) {
        if (auto e = expect(2, "at"); !e) return e.error();
        if (s.size() < 4) return at(s[2], "at needs a time");
        if (s.size() > 4) return at(s[4], "unexpected \"" + std::string(s[4].text) + "\"");
        auto t = time_of(s[3]);
        if (!t) return t.error();
        cursor = *t;
      }
      for (std::int64_t i = 0; i < *n; ++i) {
        if (auto r = add(cursor, verb); !r) return r.error();
      }
    } else if (verb.text == "idle") {
      if (s.size() != 2) return at(verb, "idle takes one duration, e.g. \"idle 20s\"");
      auto d = time_of(s[1]);
      if (!d) return d.error();
      auto moved = after(cursor, *d, s[1]);
      if (!moved) return moved.error();
      cursor = *moved;
    } else if (verb.text.ends_with("/s")) {
      auto r = rate_of(verb);
      if (!r) return r.error();
      std::int64_t from = cursor, to = cursor;
      if (s.size() >= 2 && s[1].text == "for") {
        if (s.size() != 3) return at(s[1], "for takes one duration, e.g. \"for 30s\"");
        auto d = time_of(s[2]);
        if (!d) return d.error();
        auto end = after(cursor, *d, s[2]);
        if (!end) return end.error();
        to = *end;
      } else {
        if (auto e = expect(1, "from"); !e) return e.error();
        if (s.size() < 5) return at(s.back(), "expected \"from T1 to T2\"");
        auto a = time_of(s[2]);
        if (!a) return a.error();
        if (auto e = expect(3, "to"); !e) return e.error();
        auto b = time_of(s[4]);
        if (!b) return b.error();
        if (s.size() > 5) return at(s[5], "unexpected \"" + std::string(s[5].text) + "\"");
        if (*b < *a) return at(s[4], "ends before it starts");
        from = *a;
        to = *b;
      }
      const double spacing = 1e9 / *r;
      for (double t = static_cast<double>(from); t < static_cast<double>(to); t += spacing) {
        if (auto e = add(static_cast<std::int64_t>(std::llround(t)), verb); !e) return e.error();
      }
      cursor = to;
    } else {
      return at(verb, "expected burst, idle or a rate like \"10/s\", got \"" + std::string(verb.text) + "\"");
    }
    end = std::max(end, cursor);
  }
  std::stable_sort(times.begin(), times.end());
  if (end_ns) *end_ns = std::max(end, times.empty() ? 0 : times.back() + 1);
  return times;
}

result<traffic> parse_csv(std::string_view text) {
  traffic out;
  std::vector<std::pair<double, std::uint32_t>> rows;
  std::unordered_map<std::string, std::uint32_t> ids;
  bool any_key = false;
  std::size_t row = 0;
  for (std::size_t at = 0; at < text.size();) {
    std::size_t end = text.find('\n', at);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(at, end - at);
    at = end + 1;
    ++row;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const std::size_t comma = line.find(',');
    const std::string_view time = line.substr(0, comma);
    const std::string_view key = comma == std::string_view::npos ? std::string_view() : line.substr(comma + 1);
    if (row == 1 && (time == "time" || time == "timestamp")) continue;  // a header
    double t = 0;
    auto [p, ec] = std::from_chars(time.data(), time.data() + time.size(), t);
    if (ec != std::errc() || p != time.data() + time.size() || !std::isfinite(t) || t < 0) {
      return error(errc::invalid_argument, "row " + std::to_string(row) + ": expected a time in seconds, got \"" +
                                               std::string(time.substr(0, 64)) + "\"");
    }
    if (key.find(',') != std::string_view::npos) {
      return error(errc::invalid_argument, "row " + std::to_string(row) + ": expected time[,key], got more columns");
    }
    if (rows.size() >= max_requests)
      return error(errc::invalid_argument, "more than " + std::to_string(max_requests) + " rows");
    any_key = any_key || !key.empty();
    auto [it, fresh] = ids.try_emplace(std::string(key), static_cast<std::uint32_t>(out.key_names.size()));
    if (fresh) out.key_names.emplace_back(key);
    rows.emplace_back(t, it->second);
  }
  if (rows.empty()) return error(errc::invalid_argument, "no rows");
  std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  const double first = rows.front().first;
  if ((rows.back().first - first) * 1e9 > static_cast<double>(max_span_ns)) {
    return error(errc::invalid_argument, "the rows span more than 366d");
  }
  for (const auto& [t, k] : rows) {
    out.times.push_back(std::llround((t - first) * 1e9));
    if (any_key) out.keys.push_back(k);
  }
  if (!any_key) out.key_names.clear();
  return out;
}

}  // namespace sluice::cli
