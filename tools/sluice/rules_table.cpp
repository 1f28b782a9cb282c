// SPDX-License-Identifier: Apache-2.0
#include "rules_table.hpp"

#include <algorithm>
#include <cstddef>
#include <vector>

namespace sluice::cli {
namespace {

using json = nlohmann::json;
using row = std::vector<std::string>;

// A field as text: strings as they are, numbers as JSON writes them, absent as "".
std::string text(const json& j, const char* field) {
  if (!j.is_object()) return "";
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return "";
  return it->is_string() ? it->get<std::string>() : it->dump();
}

// Rows under a header, each column as wide as its widest cell, two spaces apart.
std::string columns(const std::vector<row>& rows) {
  std::vector<std::size_t> width;
  for (const row& r : rows) {
    width.resize(std::max(width.size(), r.size()));
    for (std::size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  }
  std::string out;
  for (const row& r : rows) {
    std::string line;
    for (std::size_t i = 0; i < r.size(); ++i) {
      line += r[i];
      if (i + 1 < r.size()) line.append(width[i] - r[i].size() + 2, ' ');
    }
    line.erase(line.find_last_not_of(' ') + 1);  // an empty last cell leaves no trailing spaces
    out += line + '\n';
  }
  return out;
}

// What a rule allows, in its own terms.
std::string limit_of(const json& r) {
  if (text(r, "algorithm") == "token_bucket") return text(r, "rate") + "/s, burst " + text(r, "burst");
  if (!text(r, "tenant_limit").empty()) return text(r, "tenant_limit") + " a tenant, " + text(r, "user_limit") + " a user";
  return text(r, "limit");
}

std::string notes_of(const json& r) {
  std::string notes;
  auto add = [&](const std::string& note) { notes += (notes.empty() ? "" : ", ") + note; };
  if (!text(r, "lease").empty()) add("lease " + text(r, "lease"));
  if (text(r, "shadow") == "true") add("shadow");
  if (text(r, "when_full") == "refuse") add("refuses new keys when full");
  return notes;
}

}  // namespace

std::string rules_table(const json& body) {
  std::vector<row> rules{{"RULE", "ALGORITHM", "LIMIT", "WINDOW", "SOURCE", "NOTES"}};
  const json& list = body.is_object() && body.contains("rules") ? body["rules"] : json::array();
  for (const json& r : list.is_array() ? list : json::array()) {
    const std::string window = text(r, "window");
    rules.push_back({text(r, "name"), text(r, "algorithm"), limit_of(r), window.empty() ? "-" : window,
                     text(r, "key").empty() ? text(r, "source") : text(r, "source") + " " + text(r, "key"),
                     notes_of(r)});
  }
  std::string out = columns(rules);
  const json& overrides = body.is_object() && body.contains("override_list") ? body["override_list"] : json::array();
  if (!overrides.is_array() || overrides.empty()) return out;
  std::vector<row> rows{{"OVERRIDE OF", "FOR", "LIMIT", "SOURCE"}};
  for (const json& o : overrides) {
    std::string who = !text(o, "key").empty() ? "key " + text(o, "key") : "tenant " + text(o, "tenant");
    if (!text(o, "user").empty()) who += " user " + text(o, "user");
    std::string limits;
    for (const char* f : {"rate", "burst", "limit", "tenant_limit", "user_limit"}) {
      if (!text(o, f).empty()) limits += (limits.empty() ? "" : ", ") + std::string(f) + " " + text(o, f);
    }
    rows.push_back({text(o, "rule"), who, limits, text(o, "source")});
  }
  return out + '\n' + columns(rows);
}

}  // namespace sluice::cli
