#include "simulation.hpp"

#include <algorithm>
#include <cstdio>
#include <deque>

#include "sluice/limiter_state.hpp"

namespace sluice::cli {

namespace {

std::string seconds_text(std::int64_t ns) {
  char buf[32];
  if (ns % 1'000'000'000 == 0) {
    std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(ns / 1'000'000'000));
  } else {
    std::snprintf(buf, sizeof buf, "%gs", static_cast<double>(ns) / 1e9);
  }
  return buf;
}

}  // namespace

std::string describe(const policy& p) {
  char buf[128];
  if (p.algorithm == algorithm::token_bucket) {
    std::snprintf(buf, sizeof buf, "token_bucket rate=%g/s burst=%lld", p.rate.per_second,
                  static_cast<long long>(p.burst));
  } else {
    std::snprintf(buf, sizeof buf, "%s limit=%lld window=%s", std::string(to_string(p.algorithm)).c_str(),
                  static_cast<long long>(p.limit), seconds_text(p.window.count()).c_str());
  }
  return buf;
}

simulation simulate(const policy& p, const std::vector<std::int64_t>& times, std::int64_t step_ns,
                    std::int64_t window_ns, std::int64_t until_ns) {
  simulation out;
  out.name = describe(p);
  out.window_ns = window_ns;
  const compiled_policy cp = compiled_policy::from(p);
  limiter_state state = limiter_state::make(cp);
  const std::int64_t end = std::max(until_ns, times.empty() ? 0 : times.back() + 1);
  std::deque<std::int64_t> in_window;  // admissions within the last window_ns
  std::size_t next = 0;
  for (std::int64_t start = 0; start < end; start += step_ns) {
    step_row row{.start_ns = start};
    for (; next < times.size() && times[next] < start + step_ns; ++next) {
      const std::int64_t t = times[next];
      ++row.requests;
      if (check_and_commit(state, cp, t, 1).allowed) {
        ++row.admitted;
        in_window.push_back(t);
        while (in_window.front() <= t - window_ns) in_window.pop_front();
        out.max_admitted_in_window = std::max<std::int64_t>(out.max_admitted_in_window, in_window.size());
      } else {
        ++row.refused;
      }
    }
    // The budget at the step's end: what admitting one more would leave, plus that one.
    const decision d = state.evaluate(cp, start + step_ns, 1);
    row.remaining = d.allowed ? d.remaining + 1 : d.remaining;
    out.requests += row.requests;
    out.admitted += row.admitted;
    out.refused += row.refused;
    out.steps.push_back(row);
  }
  return out;
}

std::string render_table(const simulation& s) {
  std::string out = s.name + "\n";
  char buf[160];
  std::snprintf(buf, sizeof buf, "%10s %9s %9s %9s %10s\n", "t", "requests", "admitted", "refused", "remaining");
  out += buf;
  for (const step_row& r : s.steps) {
    if (r.requests == 0 && &r != &s.steps.back()) continue;  // quiet steps add nothing to read
    std::snprintf(buf, sizeof buf, "%10s %9lld %9lld %9lld %10lld\n", seconds_text(r.start_ns).c_str(),
                  static_cast<long long>(r.requests), static_cast<long long>(r.admitted),
                  static_cast<long long>(r.refused), static_cast<long long>(r.remaining));
    out += buf;
  }
  std::snprintf(buf, sizeof buf, "%10s %9lld %9lld %9lld\n", "total", static_cast<long long>(s.requests),
                static_cast<long long>(s.admitted), static_cast<long long>(s.refused));
  out += buf;
  std::snprintf(buf, sizeof buf, "most admitted in any %s: %lld\n", seconds_text(s.window_ns).c_str(),
                static_cast<long long>(s.max_admitted_in_window));
  out += buf;
  return out;
}

}  // namespace sluice::cli
