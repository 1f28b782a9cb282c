// SPDX-License-Identifier: Apache-2.0
// sluice: see what a policy does before you ship it (simulate, demo), and what sluiced does after
// (check, rules, config check).
#include <CLI/CLI.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <thread>
#include <tuple>
#include <iostream>

#include "chart.hpp"
#include "core/file_text.hpp"
#include "demo.hpp"
#include "rules_table.hpp"
#include "simulation.hpp"
#include "sluice/server/config.hpp"
#include "server/backend_factory.hpp"
#include "server/server.hpp"
#include "traffic.hpp"

extern char** environ;

#ifndef SLUICE_VERSION
#define SLUICE_VERSION "0.0.0"
#endif

namespace {

using namespace sluice;
using sluice::server::load_config;

int fail(const std::string& message) {
  std::cerr << "sluice: " << message << '\n';
  return 2;
}

// "FILE:NAME": the rule NAME of a sluiced config file.
result<policy> rule_from_file(const std::string& spec) {
  const auto colon = spec.rfind(':');
  if (colon == std::string::npos) return error(errc::invalid_argument, "--rule takes FILE:NAME, got \"" + spec + "\"");
  auto cfg = load_config(spec.substr(0, colon));
  if (!cfg) return cfg.error();
  const std::string name = spec.substr(colon + 1);
  auto it = std::find_if(cfg->rules.begin(), cfg->rules.end(), [&](const rule& x) { return x.name == name; });
  const rule* r = it == cfg->rules.end() ? nullptr : &*it;
  if (r == nullptr)
    return error(errc::invalid_argument, "no rule \"" + spec.substr(colon + 1) + "\" in " + spec.substr(0, colon));
  if (r->is_dual_layer())
    return error(errc::invalid_argument, "rule \"" + r->name + "\" is dual-layer: simulate one layer");
  return r->limit;
}

struct inline_policy {
  std::string algorithm;
  double rate = 0;
  std::int64_t burst = 0, limit = 0;
  std::string window;

  result<policy> make() const {
    auto a = algorithm_from_string(algorithm);
    if (!a)
      return error(errc::invalid_argument,
                   "--algorithm must be token_bucket, sliding_window, sliding_window_counter or fixed_window");
    policy p;
    if (*a == algorithm::token_bucket) {
      p = token_bucket_policy(per_second(rate), burst);
    } else {
      auto w = parse_duration(window);
      if (!w) return error(errc::invalid_argument, "--window " + w.error().message);
      p = *a == algorithm::fixed_window             ? fixed_window_policy(limit, *w)
          : *a == algorithm::sliding_window_counter ? sliding_window_counter_policy(limit, *w)
                                                    : sliding_window_policy(limit, *w);
    }
    if (auto v = validate(p); !v) return v.error();
    return p;
  }
};

// Traffic files (--traffic, --csv): the most bytes read of one.
constexpr std::size_t max_traffic_file_bytes = std::size_t{256} << 20;

// A POST /v1/check body; nlohmann-json escapes whatever the ids hold.
std::string check_body(const std::string& rule, const std::string& key, const std::string& tenant,
                       const std::string& user, std::int64_t cost) {
  nlohmann::json j{{"rule", rule}, {"cost", cost}};
  if (!key.empty()) j["key"] = key;
  if (!tenant.empty()) j["tenant"] = tenant;
  if (!user.empty()) j["user"] = user;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Rasterises an SVG with rsvg-convert (Debian's librsvg2-bin), run directly: no shell sees the names.
result<void> write_png(const std::string& svg, const std::string& png) {
  char tmpl[] = "/tmp/sluice-chart-XXXXXX";
  const int fd = ::mkstemp(tmpl);
  if (fd < 0) return error(errc::invalid_argument, "cannot make a temporary file");
  const bool written = ::write(fd, svg.data(), svg.size()) == static_cast<ssize_t>(svg.size());
  ::close(fd);
  int status = -1;
  if (written) {
    std::string out = png;
    std::vector<char*> argv = {const_cast<char*>("rsvg-convert"), const_cast<char*>("-o"), out.data(), tmpl, nullptr};
    pid_t pid = 0;
    if (::posix_spawnp(&pid, "rsvg-convert", nullptr, nullptr, argv.data(), environ) == 0) ::waitpid(pid, &status, 0);
  }
  ::unlink(tmpl);
  if (!written || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return error(errc::invalid_argument, "--png needs rsvg-convert (Debian's librsvg2-bin) and a writable " + png);
  }
  return {};
}

// Replays `t` against a running sluiced on the wall clock: request i is sent at start + times[i]
// (late when the service is slower than the pattern), for rule `rule` and the request's key.
result<cli::simulation> replay(const std::string& url, const std::string& rule, const cli::traffic& t,
                               std::int64_t step_ns, std::int64_t window_ns) {
  constexpr std::int64_t max_duration_ns = 120'000'000'000;
  constexpr std::size_t max_replayed = 20'000;
  if (!t.times.empty() && t.times.back() > max_duration_ns) {
    return error(errc::invalid_argument, "--url replays at most 120 s of traffic");
  }
  if (t.times.size() > max_replayed) return error(errc::invalid_argument, "--url replays at most 20,000 requests");
  httplib::Client client(url);
  client.set_connection_timeout(2);
  client.set_read_timeout(5);
  client.set_keep_alive(true);
  std::vector<bool> admitted;
  std::vector<std::int64_t> remaining;
  // Keys of their own for this run, so that a rerun does not start with the last run's debt.
  const std::string run = "simulate-" + std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                           std::chrono::system_clock::now().time_since_epoch())
                                                           .count());
  std::cout << "replaying on keys " << run << (t.keys.empty() ? "" : ":<csv key>") << '\n';
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < t.times.size(); ++i) {
    std::this_thread::sleep_until(start + std::chrono::nanoseconds(t.times[i]));  // pacing real requests
    const std::string body = check_body(rule, t.keys.empty() ? run : run + ":" + t.key_names[t.keys[i]], "", "", 1);
    auto r = client.Post("/v1/check", body, "application/json");
    if (!r) return error(errc::backend_unavailable, "cannot reach " + url + ": " + httplib::to_string(r.error()));
    if (r->status != 200 && r->status != 429) {
      return error(errc::invalid_argument,
                   "sluiced answered " + std::to_string(r->status) + ": " + r->body);
    }
    admitted.push_back(r->status == 200);
    const auto answer = nlohmann::json::parse(r->body, nullptr, /*allow_exceptions=*/false);
    const auto left = answer.is_object() ? answer.find("remaining") : answer.end();
    remaining.push_back(left != answer.end() && left->is_number_integer() ? left->get<std::int64_t>() : 0);
  }
  return cli::tally("sluiced rule " + rule + " at " + url + " (observed)", t.times, admitted, remaining, step_ns,
                    window_ns);
}

// Asks sluiced; prints its status and body, or with `show` what it makes of a 2xx body.
int http(const std::string& url, const char* method, const std::string& path, const std::string& body,
         const std::function<std::string(const std::string&)>& show = {}) {
  httplib::Client client(url);
  client.set_connection_timeout(2);
  client.set_read_timeout(5);
  auto r = std::string(method) == "GET" ? client.Get(path) : client.Post(path, body, "application/json");
  if (!r) return fail("cannot reach " + url + ": " + httplib::to_string(r.error()));
  if (show && r->status < 300) {
    std::cout << show(r->body);
  } else {
    std::cout << r->status << ' ' << r->body << '\n';
  }
  // The exit codes --help lists: 0 admitted (or answered), 1 refused, 3 the request refused.
  if (r->status < 300) return 0;
  return r->status == 429 ? 1 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"sluice: simulate rate-limit policies, and ask a running sluiced"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("sluice ") + SLUICE_VERSION);
  app.footer(
      "Exit codes: 0 done (check: admitted), 1 check: refused (429), 2 could not run (bad arguments or files, "
      "sluiced unreachable), 3 sluiced refused the request (another 4xx or a 5xx).");

  auto* sim = app.add_subcommand("simulate", "Replay a traffic pattern against one or more policies");
  std::string pattern, traffic_file, csv_file, svg_file, png_file, step = "1s", window_of = "60s";
  std::vector<std::string> rule_specs;
  inline_policy in;
  sim->add_option("--pattern", pattern, "e.g. \"burst 60 at 0s; 10/s from 0s to 30s; idle 20s; burst 60\"");
  sim->add_option("--traffic", traffic_file, "a file holding a pattern");
  sim->add_option("--csv", csv_file, "a CSV of time[,key] rows (seconds, e.g. from an access log)");
  sim->add_option("--rule", rule_specs, "FILE:NAME, a rule of a sluiced config (repeatable)");
  sim->add_option("--algorithm", in.algorithm, "token_bucket | sliding_window | sliding_window_counter | fixed_window");
  sim->add_option("--rate", in.rate, "token bucket: tokens per second");
  sim->add_option("--burst", in.burst, "token bucket: capacity");
  sim->add_option("--limit", in.limit, "windows: admissions per window");
  sim->add_option("--window", in.window, "windows: length, e.g. 60s");
  sim->add_option("--step", step, "table and chart step (default 1s)");
  sim->add_option("--max-window", window_of, "report the most admitted in any window this long (default 60s)");
  sim->add_option("--svg", svg_file, "draw the runs into this SVG file");
  std::string chart_from, chart_to;
  sim->add_option("--from", chart_from, "draw from this time on, e.g. 50s (default: the start)");
  sim->add_option("--to", chart_to, "draw up to this time, e.g. 70s (default: the end)");
  sim->add_option("--png", png_file, "draw the runs into this PNG file (with rsvg-convert)");
  std::string replay_url, replay_rule;
  sim->add_option("--url", replay_url, "also replay the traffic against this running sluiced, on the wall clock");
  sim->add_option("--url-rule", replay_rule, "the rule to check there (default: the first --rule's name)");

  auto* demo = app.add_subcommand("demo", "The r = 5/s, b = 60 walk-through and the 2N pitfall");

  auto* check = app.add_subcommand("check", "Ask a running sluiced for one decision");
  std::string url = "http://127.0.0.1:8080", rule_name = "default", key, tenant, user;
  std::int64_t cost = 1;
  check->add_option("--url", url, "sluiced's address");
  check->add_option("--rule", rule_name, "the rule");
  check->add_option("--key", key, "single-layer rules: the key");
  check->add_option("--tenant", tenant, "dual-layer rules: the tenant");
  check->add_option("--user", user, "dual-layer rules: the user");
  check->add_option("--cost", cost, "units (default 1)");

  auto* rules = app.add_subcommand("rules", "List the rules a running sluiced has in force");
  rules->add_option("--url", url, "sluiced's address");
  bool rules_json = false;
  rules->add_flag("--json", rules_json, "print sluiced's JSON as it comes, instead of the tables");

  auto* config = app.add_subcommand("config", "Work with sluiced config files");
  auto* config_check = config->add_subcommand("check", "Validate a config as sluiced --check-config does");
  std::string config_file;
  config_check->add_option("FILE", config_file, "the TOML file")->required();
  config->require_subcommand(1);

  CLI11_PARSE(app, argc, argv);

  if (*demo) return cli::run_demo(std::cout);
  if (*rules) {
    if (rules_json) return http(url, "GET", "/v1/rules", "");
    return http(url, "GET", "/v1/rules", "", [](const std::string& body) {
      return cli::rules_table(nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false));
    });
  }
  if (*check) {
    return http(url, "POST", "/v1/check", check_body(rule_name, key, tenant, user, cost));
  }
  if (*config_check) {
    auto checked = server::check_config_file(config_file);
    if (!checked) {
      std::cerr << checked.error().message << '\n';
      return 1;
    }
    std::cout << *checked << '\n';
    return 0;
  }

  // simulate
  std::vector<policy> policies;
  if (!in.algorithm.empty()) {
    auto p = in.make();
    if (!p) return fail(p.error().message);
    policies.push_back(*p);
  }
  for (const auto& spec : rule_specs) {
    auto p = rule_from_file(spec);
    if (!p) return fail(p.error().message);
    policies.push_back(*p);
  }
  if (policies.empty()) return fail("simulate needs a policy: --algorithm ... or --rule FILE:NAME");
  if (!pattern.empty() + !traffic_file.empty() + !csv_file.empty() != 1) {
    return fail("simulate needs one of --pattern, --traffic or --csv");
  }
  cli::traffic requests;
  if (!csv_file.empty()) {
    auto text = detail::read_file_text(csv_file, max_traffic_file_bytes);
    if (!text) return fail(text.error().message);
    auto t = cli::parse_csv(*text);
    if (!t) return fail(csv_file + ": " + t.error().message);
    requests = std::move(*t);
  } else {
    if (!traffic_file.empty()) {
      auto text = detail::read_file_text(traffic_file, max_traffic_file_bytes);
      if (!text) return fail(text.error().message);
      pattern = std::move(*text);
    }
    auto times = cli::parse_traffic(pattern, &requests.end_ns);
    if (!times) return fail("traffic " + times.error().message);
    requests.times = std::move(*times);
  }
  auto step_ns = parse_duration(step);
  auto window_ns = parse_duration(window_of);
  if (!step_ns || step_ns->count() <= 0) return fail("--step must be a duration like 1s");
  if (auto steps = cli::check_steps(requests.times, step_ns->count()); !steps) return fail(steps.error().message);
  if (!window_ns || window_ns->count() <= 0) return fail("--max-window must be a duration like 60s");
  std::vector<cli::simulation> runs;
  for (const policy& p : policies) {
    runs.push_back(
        cli::simulate(p, requests.times, step_ns->count(), window_ns->count(), requests.end_ns, requests.keys));
    std::cout << cli::render_table(runs.back()) << '\n';
  }
  if (!replay_url.empty()) {
    if (replay_rule.empty() && !rule_specs.empty())
      replay_rule = rule_specs.front().substr(rule_specs.front().rfind(':') + 1);
    if (replay_rule.empty()) return fail("--url needs --url-rule (or a --rule FILE:NAME)");
    auto observed = replay(replay_url, replay_rule, requests, step_ns->count(), window_ns->count());
    if (!observed) return fail(observed.error().message);
    runs.push_back(std::move(*observed));
    std::cout << cli::render_table(runs.back()) << '\n';
  }
  cli::chart_options chart;
  for (auto [text, at, name] : {std::tuple{&chart_from, &chart.from_ns, "--from"}, {&chart_to, &chart.to_ns, "--to"}}) {
    if (text->empty()) continue;
    auto d = parse_duration(*text);
    if (!d || d->count() < 0) return fail(std::string(name) + " must be a time like 50s, got \"" + *text + "\"");
    *at = d->count();
  }
  if (chart.to_ns <= chart.from_ns) return fail("--to must be after --from");
  if (!svg_file.empty()) {
    std::ofstream out(svg_file, std::ios::binary);
    out << cli::render_svg(runs, chart);
    if (!out) return fail("cannot write " + svg_file);
  }
  if (!png_file.empty()) {
    if (auto r = write_png(cli::render_svg(runs, chart), png_file); !r) return fail(r.error().message);
  }
  return 0;
}
