// SPDX-License-Identifier: Apache-2.0
#include "simulation.hpp"

#include <algorithm>
#include <cstdio>
#include <deque>

#include "sluice/limiter_state.hpp"
#include "traffic.hpp"

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

result<void> check_steps(const std::vector<std::int64_t>& times, std::int64_t step_ns) {
  if (step_ns <= 0 || step_ns > max_span_ns) return error(errc::invalid_argument, "--step must be at most 366d");
  const std::int64_t end = times.empty() ? 1 : times.back() + 1;
  const std::int64_t steps = end / step_ns + (end % step_ns != 0);
  if (steps <= max_steps) return {};
  std::string why = "--step ";
  why += seconds_text(step_ns);
  why += " makes " + std::to_string(steps) + " rows, more than " + std::to_string(max_steps) + ": take a longer step";
  return error(errc::invalid_argument, why);
}

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

namespace {

// Steps through `times`: admit(i) says whether request i was admitted, budget(step_end) what was
// left at a step's end. The most admitted in a window is counted per key (`keys`, or one).
template <class Admit, class Budget>
simulation run_steps(std::string name, const std::vector<std::int64_t>& times, const std::vector<std::uint32_t>& keys,
                     std::uint32_t key_count, std::int64_t step_ns, std::int64_t window_ns, std::int64_t until_ns,
                     Admit admit, Budget budget) {
  simulation out;
  out.name = std::move(name);
  out.window_ns = window_ns;
  std::vector<std::deque<std::int64_t>> in_window(key_count);  // each key's admissions in the last window_ns
  const std::int64_t end = std::max(until_ns, times.empty() ? 0 : times.back() + 1);
  std::size_t next = 0;
  for (std::int64_t start = 0; start < end; start += step_ns) {
    step_row row{.start_ns = start};
    std::vector<std::uint32_t> checked;  // the keys checked in this step
    for (; next < times.size() && times[next] < start + step_ns; ++next) {
      ++row.requests;
      const std::uint32_t k = keys.empty() ? 0 : keys[next];
      if (!keys.empty()) checked.push_back(k);
      if (!admit(next)) {
        ++row.refused;
        continue;
      }
      ++row.admitted;
      auto& w = in_window[k];
      w.push_back(times[next]);
      while (w.front() <= times[next] - window_ns) w.pop_front();
      out.max_admitted_in_window = std::max<std::int64_t>(out.max_admitted_in_window, w.size());
    }
    if (keys.empty()) checked.push_back(0);
    for (std::uint32_t k : checked) {
      auto& w = in_window[k];
      while (!w.empty() && w.front() <= start + step_ns - window_ns) w.pop_front();
      row.in_window = std::max<std::int64_t>(row.in_window, static_cast<std::int64_t>(w.size()));
    }
    row.remaining = budget(start + step_ns);
    out.requests += row.requests;
    out.admitted += row.admitted;
    out.refused += row.refused;
    out.steps.push_back(row);
  }
  return out;
}

}  // namespace

simulation simulate(const policy& p, const std::vector<std::int64_t>& times, std::int64_t step_ns,
                    std::int64_t window_ns, std::int64_t until_ns, const std::vector<std::uint32_t>& keys) {
  const compiled_policy cp = compiled_policy::from(p);
  std::uint32_t key_count = 1;
  for (std::uint32_t k : keys) key_count = std::max(key_count, k + 1);
  std::vector<limiter_state> states(key_count, limiter_state::make(cp));
  std::vector<bool> seen(key_count, false);
  auto admit = [&](std::size_t i) {
    const std::uint32_t k = keys.empty() ? 0 : keys[i];
    seen[k] = true;
    return check_and_commit(states[k], cp, times[i], 1).allowed;
  };
  // The budget at a step's end (of the key with the least): what one more would leave, plus it.
  auto budget = [&](std::int64_t at) {
    std::int64_t least = -1;
    for (std::uint32_t k = 0; k < key_count; ++k) {
      if (!seen[k] && key_count > 1) continue;
      const decision d = states[k].evaluate(cp, at, 1);
      const std::int64_t left = d.allowed ? d.remaining + 1 : d.remaining;
      least = least < 0 ? left : std::min(least, left);
    }
    return least < 0 ? p.capacity() : least;
  };
  simulation out = run_steps(describe(p), times, keys, key_count, step_ns, window_ns, until_ns, admit, budget);
  out.capacity = p.capacity();
  // A window policy's limit; a token bucket's burst and what its rate refills over the window (none
  // drawn for an unlimited rate).
  const double refill = p.rate.per_second * static_cast<double>(window_ns) / 1e9;
  if (p.algorithm != algorithm::token_bucket) {
    out.window_limit = p.limit;
  } else if (!p.rate.is_infinite() && refill < 1e15) {
    out.window_limit = p.burst + static_cast<std::int64_t>(refill);
  }
  return out;
}

simulation tally(std::string name, const std::vector<std::int64_t>& times, const std::vector<bool>& admitted,
                 const std::vector<std::int64_t>& remaining, std::int64_t step_ns, std::int64_t window_ns) {
  std::int64_t last = 0;  // the budget the latest answer reported
  auto admit = [&](std::size_t i) {
    last = remaining[i];
    return static_cast<bool>(admitted[i]);
  };
  return run_steps(std::move(name), times, {}, 1, step_ns, window_ns, 0, admit, [&](std::int64_t) { return last; });
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
