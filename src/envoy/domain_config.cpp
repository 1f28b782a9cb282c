// SPDX-License-Identifier: Apache-2.0
#include "envoy/domain_config.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <map>
#include <set>

#include "core/file_text.hpp"
#include "sluice/duration.hpp"

namespace sluice::envoy {
namespace {

constexpr std::int64_t second_ns = 1'000'000'000;

// The line (1-based) where `text`'s collections first nest deeper than max_yaml_depth, or 0. A scan
// of the text as YAML lays it out: flow collections ([ {) opened where a node starts or inside
// another flow collection; block ones by indentation and by "- " / "? " entries (compact ones
// nest on one line). Quoted scalars, block scalars (| >) and comments hold no collections.
std::size_t too_deep_at(std::string_view text) {
  std::vector<std::size_t> block;  // the columns of the block nodes open
  int flow = 0;
  char quote = 0;                                 // inside a quoted scalar: its quote
  std::size_t scalar_parent = std::string::npos;  // inside a block scalar: lines indented more are its text
  bool node_start = false;                        // a node may start here
  std::size_t line = 0;
  for (std::size_t pos = 0; pos < text.size();) {
    ++line;
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view l = text.substr(pos, end - pos);
    pos = end + 1;
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    std::size_t indent = l.find_first_not_of(' ');
    if (indent == std::string_view::npos) indent = l.size();
    const bool blank = indent == l.size() || l[indent] == '#';
    if (scalar_parent != std::string::npos) {
      if (blank || indent > scalar_parent) continue;
      scalar_parent = std::string::npos;
    }
    std::size_t i = 0;
    if (quote == 0 && flow == 0) {
      if (blank || l[0] == '%') continue;
      if ((l.starts_with("---") || l.starts_with("...")) && (l.size() == 3 || l[3] == ' ')) {
        block.clear();
        i = 3;
      } else {
        while (!block.empty() && block.back() >= indent) block.pop_back();
        block.push_back(indent);
        i = indent;
      }
      node_start = true;
    }
    for (; i < l.size(); ++i) {
      const char c = l[i];
      if (quote != 0) {
        if (quote == '"' && c == '\\') {
          ++i;
        } else if (c == quote) {
          if (quote == '\'' && i + 1 < l.size() && l[i + 1] == '\'') {
            ++i;  // '' is a quote inside a single-quoted scalar
          } else {
            quote = 0;
          }
        }
        continue;
      }
      if (c == ' ' || c == '\t') continue;
      if (c == '#' && (i == 0 || l[i - 1] == ' ' || l[i - 1] == '\t')) break;
      const bool spaced = i + 1 == l.size() || l[i + 1] == ' ' || l[i + 1] == '\t';
      if (node_start && flow == 0 && (c == '-' || c == '?') && spaced) {
        const std::size_t next = l.find_first_not_of(" \t", i + 1);
        if (next != std::string_view::npos && l[next] != '#') block.push_back(next);  // the entry's node
      } else if (node_start && flow == 0 && (c == '|' || c == '>')) {
        scalar_parent = indent;
        break;
      } else if (node_start && (c == '"' || c == '\'')) {
        quote = c;
        node_start = false;
      } else if (node_start && (c == '&' || c == '!')) {  // an anchor or tag: the node follows
        while (i + 1 < l.size() && l[i + 1] != ' ' && l[i + 1] != '\t') ++i;
      } else if ((c == '[' || c == '{') && (node_start || flow > 0)) {
        ++flow;
        node_start = true;
      } else if ((c == ']' || c == '}') && flow > 0) {
        --flow;
        node_start = false;
      } else if (flow > 0 && c == ',') {
        node_start = true;
      } else if (c == ':' && (spaced || flow > 0)) {
        node_start = true;  // a value follows
      } else {
        node_start = false;
      }
      if (block.size() + static_cast<std::size_t>(flow) > static_cast<std::size_t>(max_yaml_depth)) return line;
    }
  }
  return 0;
}

// Reads one file's nodes; the first error ends the walk (thrown, caught once in parse_domain).
class reader {
 public:
  explicit reader(std::string_view file) : file_(file) {}

  [[noreturn]] void fail(const YAML::Node& at, const std::string& message) const {
    throw error(errc::config_invalid, where(at) + ": " + message);
  }
  std::string where(const YAML::Node& at) const { return file_ + ":" + std::to_string(at.Mark().line + 1); }

  // The map's keys, each one of `allowed`.
  void expect_keys(const YAML::Node& map, std::initializer_list<std::string_view> allowed,
                   std::string_view what) const {
    if (!map.IsMap()) fail(map, std::string(what) + " must be a mapping");
    for (auto it = map.begin(); it != map.end(); ++it) {
      const std::string k = scalar(it->first, "a key");
      if (std::find(allowed.begin(), allowed.end(), k) == allowed.end()) {
        fail(it->first, "unknown key '" + k + "' in " + std::string(what));
      }
    }
  }

  std::string scalar(const YAML::Node& n, std::string_view what) const {
    if (!n.IsScalar()) fail(n, std::string(what) + " must be a string");
    return n.Scalar();
  }

  bool boolean(const YAML::Node& n, std::string_view what) const {
    bool b = false;
    if (!n.IsScalar() || !YAML::convert<bool>::decode(n, b)) fail(n, std::string(what) + " must be true or false");
    return b;
  }

  std::int64_t integer(const YAML::Node& n, std::string_view what, std::int64_t lo, std::int64_t hi) const {
    const std::string s = n.IsScalar() ? n.Scalar() : std::string();
    std::int64_t v = 0;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || ec != std::errc() || end != s.data() + s.size() || v < lo || v > hi) {
      fail(n, std::string(what) + " must be an integer in " + std::to_string(lo) + ".." + std::to_string(hi));
    }
    return v;
  }

  rate_limit_config rate_limit(const YAML::Node& n) {
    count_limit(n);
    expect_keys(n, {"unit", "requests_per_unit", "name", "unlimited", "replaces", "algorithm", "burst", "window"},
                "a rate_limit");
    rate_limit_config r;
    r.where = where(n);
    if (n["name"]) r.name = scalar(n["name"], "name");
    if (n["unlimited"]) r.unlimited = boolean(n["unlimited"], "unlimited");
    if (r.unlimited && n["unit"]) fail(n["unit"], "an unlimited rate_limit has no unit");
    if (n["unit"]) {
      auto u = unit_from_string(scalar(n["unit"], "unit"));
      if (!u || *u == unit::unknown)
        fail(n["unit"],
             "unit must be second, minute, hour, day, week, month or year, got '" + n["unit"].Scalar() + "'");
      r.unit = *u;
    }
    if (n["requests_per_unit"]) {
      r.requests_per_unit =
          static_cast<std::uint32_t>(integer(n["requests_per_unit"], "requests_per_unit", 0, UINT32_MAX));
    }
    if (n["window"]) {
      auto w = parse_duration(scalar(n["window"], "window"));
      if (!w || w->count() <= 0) fail(n["window"], "window " + (w ? std::string("must be > 0") : w.error().message));
      r.window = *w;
    }
    if (n["algorithm"]) {
      const std::string a = scalar(n["algorithm"], "algorithm");
      auto alg = algorithm_from_string(a);
      if (!alg) {
        fail(n["algorithm"],
             "algorithm must be fixed_window, token_bucket, sliding_window or sliding_window_counter, got '" + a + "'");
      }
      r.algorithm = *alg;
    }
    if (n["burst"]) {
      if (r.algorithm != algorithm::token_bucket) fail(n["burst"], "burst is for algorithm: token_bucket only");
      r.burst = integer(n["burst"], "burst", 0, UINT32_MAX);
    }
    if (n["replaces"] && !n["replaces"].IsNull()) {
      const YAML::Node& list = n["replaces"];
      if (!list.IsSequence()) fail(list, "replaces must be a list of {name: ...}");
      for (const YAML::Node& item : list) {
        expect_keys(item, {"name"}, "a replaces entry");
        if (!item["name"] || item["name"].IsNull() || item["name"].Scalar().empty())
          fail(item, "a replaces entry needs a name");
        count_limit(item);
        r.replaces.push_back(scalar(item["name"], "name"));
        if (r.replaces.back() == r.name)
          fail(item, "rate_limit '" + r.name + "' replaces itself, which would turn it off");
      }
    }
    if (!r.unlimited) {
      if (!n["requests_per_unit"]) fail(n, "a rate_limit needs requests_per_unit (or unlimited: true)");
      if (!n["unit"] && !r.window) fail(n, "a rate_limit needs a unit (or window)");
      if (auto v = validate(r.to_policy()); !v) fail(n, v.error().message);
    }
    return r;
  }

  descriptor_config descriptor(const YAML::Node& n, int depth) {
    if (depth > max_descriptor_depth)
      fail(n, "descriptors nest deeper than " + std::to_string(max_descriptor_depth) + " levels");
    if (++descriptors_ > max_descriptors_per_domain)
      fail(n, "more than " + std::to_string(max_descriptors_per_domain) + " descriptors in one domain");
    expect_keys(n,
                {"key", "value", "rate_limit", "rate_limits", "descriptors", "shadow_mode", "quota_mode",
                 "detailed_metric", "share_threshold", "value_to_metric", "metadata"},
                "a descriptor");
    descriptor_config d;
    d.where = where(n);
    if (!n["key"]) fail(n, "a descriptor needs a key");
    d.key = scalar(n["key"], "key");
    if (d.key.empty()) fail(n["key"], "key must not be empty");
    if (n["value"]) d.value = scalar(n["value"], "value");
    if (n["rate_limit"] && n["rate_limits"]) fail(n, "a descriptor has rate_limit or rate_limits, not both");
    if (n["rate_limit"]) d.limits.push_back(rate_limit(n["rate_limit"]));
    if (n["rate_limits"]) {
      const YAML::Node& list = n["rate_limits"];
      if (!list.IsSequence() || list.size() == 0) fail(list, "rate_limits must be a list of rate limits");
      for (const YAML::Node& item : list) d.limits.push_back(rate_limit(item));
    }
    for (auto [name, flag] :
         {std::pair{"shadow_mode", &d.shadow_mode}, std::pair{"quota_mode", &d.quota_mode},
          std::pair{"detailed_metric", &d.detailed_metric}, std::pair{"share_threshold", &d.share_threshold},
          std::pair{"value_to_metric", &d.value_to_metric}}) {
      if (n[name]) *flag = boolean(n[name], name);
    }
    if (d.share_threshold && d.value.find('*') == std::string::npos)
      fail(n["share_threshold"], "share_threshold is for a value with a wildcard ('*')");
    if (n["metadata"]) {
      if (!n["metadata"].IsMap()) fail(n["metadata"], "metadata must be a mapping");
      ignored_.push_back(where(n["metadata"]) + ": metadata (sent by the reference as dynamic metadata) is not used");
    }
    if (n["descriptors"]) d.descriptors = descriptors(n["descriptors"], depth + 1);
    return d;
  }

  // Siblings are told apart by key and value, as the service looks them up. No list (null) is an
  // empty one, as the reference reads it.
  std::vector<descriptor_config> descriptors(const YAML::Node& list, int depth) {
    if (list.IsNull()) return {};
    if (!list.IsSequence()) fail(list, "descriptors must be a list");
    std::vector<descriptor_config> out;
    std::set<std::pair<std::string, std::string>> seen;
    for (const YAML::Node& item : list) {
      descriptor_config d = descriptor(item, depth);
      if (!seen.emplace(d.key, d.value).second) {
        fail(item, "duplicate descriptor key '" + d.key + "'" + (d.value.empty() ? "" : " value '" + d.value + "'"));
      }
      out.push_back(std::move(d));
    }
    return out;
  }

  /// What the file set that is read and left unused.
  std::vector<std::string> take_ignored() { return std::move(ignored_); }

 private:
  // An anchor's node is walked at each of its aliases: what it adds is counted each time.
  void count_limit(const YAML::Node& at) {
    if (++limits_ > max_limits_per_domain)
      fail(at,
           "more than " + std::to_string(max_limits_per_domain) + " rate limits and replaces entries in one domain");
  }

  std::string file_;
  std::vector<std::string> ignored_;
  std::size_t descriptors_ = 0;
  std::size_t limits_ = 0;
};

// Limits that replace each other would turn each other off in every request they all apply to:
// refused at the limit that closes the cycle (one replacing itself is refused as it is read).
struct replaces_edge {
  std::string_view to;
  const rate_limit_config* by;
};
using replaces_graph = std::map<std::string_view, std::vector<replaces_edge>>;

void add_edges(const std::vector<descriptor_config>& descriptors, replaces_graph& graph) {
  for (const descriptor_config& d : descriptors) {
    for (const rate_limit_config& l : d.limits) {
      for (const std::string& to : l.replaces) {
        if (!l.name.empty()) graph[l.name].push_back({to, &l});  // an unnamed limit is never replaced
      }
    }
    add_edges(d.descriptors, graph);  // at most max_descriptor_depth deep
  }
}

std::optional<error> replaces_cycle(const domain_config& d) {
  replaces_graph graph;
  add_edges(d.descriptors, graph);
  // A depth-first walk without recursion (a chain of replaces may be long): 1 on the path, 2 done.
  std::map<std::string_view, int> state;
  for (const auto& start : graph) {
    if (state[start.first] != 0) continue;
    std::vector<std::pair<std::string_view, std::size_t>> path{{start.first, 0}};  // name, next edge
    state[start.first] = 1;
    while (!path.empty()) {
      const std::string_view name = path.back().first;
      const std::vector<replaces_edge>& edges = graph.find(name)->second;
      if (path.back().second == edges.size()) {
        state[name] = 2;
        path.pop_back();
        continue;
      }
      const replaces_edge& e = edges[path.back().second++];
      int& seen = state[e.to];
      if (seen == 1) {
        std::string cycle;
        auto it = std::find_if(path.begin(), path.end(), [&](const auto& p) { return p.first == e.to; });
        for (; it != path.end(); ++it) cycle += "'" + std::string(it->first) + "' replaces ";
        return error(errc::config_invalid, e.by->where + ": replaces form a cycle (" + cycle + "'" + std::string(e.to) +
                                               "'), which would turn these limits off");
      }
      if (seen == 0 && graph.contains(e.to)) {
        seen = 1;
        path.emplace_back(e.to, 0);
      } else {
        seen = 2;
      }
    }
  }
  return std::nullopt;
}

}  // namespace

nanoseconds unit_length(unit u) noexcept {
  switch (u) {
    case unit::second: return nanoseconds(second_ns);
    case unit::minute: return nanoseconds(60 * second_ns);
    case unit::hour: return nanoseconds(3600 * second_ns);
    case unit::day: return nanoseconds(86'400 * second_ns);
    case unit::week: return nanoseconds(7 * 86'400 * second_ns);
    case unit::month: return nanoseconds(30 * 86'400 * second_ns);
    case unit::year: return nanoseconds(365 * 86'400 * second_ns);
    case unit::unknown: break;
  }
  return nanoseconds(0);
}

std::optional<unit> unit_from_string(std::string_view s) noexcept {
  std::string lower(s);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (unit u : {unit::second, unit::minute, unit::hour, unit::day, unit::month, unit::year, unit::week}) {
    if (lower == to_string(u)) return u;
  }
  return std::nullopt;
}

std::string_view to_string(unit u) noexcept {
  switch (u) {
    case unit::second: return "second";
    case unit::minute: return "minute";
    case unit::hour: return "hour";
    case unit::day: return "day";
    case unit::month: return "month";
    case unit::year: return "year";
    case unit::week: return "week";
    case unit::unknown: break;
  }
  return "unknown";
}

policy rate_limit_config::to_policy() const {
  if (requests_per_unit == 0) return token_bucket_policy(per_second(0), 0);  // refuses everything
  const nanoseconds w = length();
  if (algorithm == algorithm::token_bucket) {
    const double seconds = std::chrono::duration<double>(w).count();
    return token_bucket_policy(per_second(seconds > 0 ? requests_per_unit / seconds : 0),
                               burst ? *burst : requests_per_unit);
  }
  return {.algorithm = algorithm, .limit = requests_per_unit, .window = w};
}

result<domain_config> parse_domain(std::string_view yaml_text, std::string_view file) {
  if (yaml_text.size() > max_config_file_bytes) {
    return {errc::config_invalid,
            std::string(file) + ": larger than " + std::to_string(max_config_file_bytes) + " bytes"};
  }
  if (const std::size_t line = too_deep_at(yaml_text)) {
    return {errc::config_invalid, std::string(file) + ":" + std::to_string(line) + ": collections nest deeper than " +
                                      std::to_string(max_yaml_depth) + " levels"};
  }
  reader r(file);
  try {
    const YAML::Node root = YAML::Load(std::string(yaml_text));
    r.expect_keys(root, {"domain", "descriptors"}, "the file");
    domain_config d;
    d.file = file;
    if (!root["domain"]) r.fail(root, "the file needs a domain");
    d.domain = r.scalar(root["domain"], "domain");
    if (d.domain.empty()) r.fail(root["domain"], "domain must not be empty");
    if (root["descriptors"]) d.descriptors = r.descriptors(root["descriptors"], 1);
    if (auto cycle = replaces_cycle(d)) return *cycle;
    d.ignored = r.take_ignored();
    return d;
  } catch (const error& e) {
    return e;
  } catch (const YAML::Exception& e) {
    return {errc::config_invalid, std::string(file) + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg};
  }
}

result<std::vector<domain_config>> load_domains(const std::filesystem::path& dir, bool merge) {
  std::error_code ec;
  std::vector<std::filesystem::path> files;
  for (auto it = std::filesystem::directory_iterator(dir, ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec)) {
    const auto ext = it->path().extension();
    if ((ext == ".yaml" || ext == ".yml") && it->is_regular_file(ec)) files.push_back(it->path());
  }
  if (ec) return {errc::config_invalid, dir.string() + ": " + ec.message()};
  std::sort(files.begin(), files.end());
  std::vector<domain_config> out;
  for (const auto& f : files) {
    auto text = detail::read_file_text(f.string(), max_config_file_bytes);
    if (!text) return text.error();
    auto d = parse_domain(*text, f.string());
    if (!d) return d.error();
    auto other = std::find_if(out.begin(), out.end(), [&](const domain_config& o) { return o.domain == d->domain; });
    if (other == out.end()) {
      out.push_back(std::move(*d));
      continue;
    }
    if (!merge)
      return {errc::config_invalid, f.string() + ": domain '" + d->domain + "' is also defined by " + other->file};
    // Merged: this file's descriptors join the domain's; one both define is an error, as a
    // duplicate within one file is.
    for (descriptor_config& desc : d->descriptors) {
      const bool taken = std::any_of(other->descriptors.begin(), other->descriptors.end(),
                                     [&](const auto& o) { return o.key == desc.key && o.value == desc.value; });
      if (taken) {
        return {errc::config_invalid, desc.where + ": descriptor '" + desc.key +
                                          (desc.value.empty() ? "" : "_" + desc.value) + "' of domain '" + d->domain +
                                          "' is also defined by " + other->file};
      }
      other->descriptors.push_back(std::move(desc));
    }
    for (std::string& i : d->ignored) other->ignored.push_back(std::move(i));
    if (auto cycle = replaces_cycle(*other)) return *cycle;
  }
  return out;
}

}  // namespace sluice::envoy
