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
                    std::int64_t window_ns, std::int64_t until_ns, const std::vector<std::uint32_t>& keys) {
  simulation out;
  out.name = describe(p);
  out.window_ns = window_ns;
  const compiled_policy cp = compiled_policy::from(p);
  std::uint32_t key_count = 1;
  for (std::uint32_t k : keys) key_count = std::max(key_count, k + 1);
  std::vector<limiter_state> states(key_count, limiter_state::make(cp));
  std::vector<bool> seen(key_count, false);
  std::vector<std::deque<std::int64_t>> in_window(key_count);  // each key's admissions in the last window_ns
  const std::int64_t end = std::max(until_ns, times.empty() ? 0 : times.back() + 1);
  std::size_t next = 0;
  for (std::int64_t start = 0; start < end; start += step_ns) {
    step_row row{.start_ns = start};
    for (; next < times.size() && times[next] < start + step_ns; ++next) {
      const std::int64_t t = times[next];
      const std::uint32_t k = keys.empty() ? 0 : keys[next];
      seen[k] = true;
      ++row.requests;
      if (check_and_commit(states[k], cp, t, 1).allowed) {
        ++row.admitted;
        auto& w = in_window[k];
        w.push_back(t);
        while (w.front() <= t - window_ns) w.pop_front();
        out.max_admitted_in_window = std::max<std::int64_t>(out.max_admitted_in_window, w.size());
      } else {
        ++row.refused;
      }
    }
    // The budget at the step's end (of the key with the least): what one more would leave, plus it.
    row.remaining = -1;
    for (std::uint32_t k = 0; k < key_count; ++k) {
      if (!seen[k] && key_count > 1) continue;
      const decision d = states[k].evaluate(cp, start + step_ns, 1);
      const std::int64_t budget = d.allowed ? d.remaining + 1 : d.remaining;
      row.remaining = row.remaining < 0 ? budget : std::min(row.remaining, budget);
    }
    if (row.remaining < 0) row.remaining = p.algorithm == algorithm::token_bucket ? p.burst : p.limit;
    out.requests += row.requests;
    out.admitted += row.admitted;
    out.refused += row.refused;
    out.steps.push_back(row);
  }
  return out;
}

simulation tally(std::string name, const std::vector<std::int64_t>& times, const std::vector<bool>& admitted,
                 const std::vector<std::int64_t>& remaining, std::int64_t step_ns, std::int64_t window_ns) {
  simulation out;
  out.name = std::move(name);
  out.window_ns = window_ns;
  std::deque<std::int64_t> in_window;
  std::size_t next = 0;
  std::int64_t budget = 0;
  const std::int64_t end = times.empty() ? 0 : times.back() + 1;
  for (std::int64_t start = 0; start < end; start += step_ns) {
    step_row row{.start_ns = start};
    for (; next < times.size() && times[next] < start + step_ns; ++next) {
      ++row.requests;
      budget = remaining[next];
      if (admitted[next]) {
        ++row.admitted;
        in_window.push_back(times[next]);
        while (in_window.front() <= times[next] - window_ns) in_window.pop_front();
        out.max_admitted_in_window = std::max<std::int64_t>(out.max_admitted_in_window, in_window.size());
      } else {
        ++row.refused;
      }
    }
    row.remaining = budget;
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
