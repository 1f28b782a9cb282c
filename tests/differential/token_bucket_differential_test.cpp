// SPDX-License-Identifier: Apache-2.0
// sluice::token_bucket against Go's golang.org/x/time/rate itself: seeded random traces of
// try_acquire / reserve / cancel / set_rate / set_burst / tokens on one bucket, run by sluice here and
// by x/time/rate in tests/differential/xtime_oracle.go, compared operation by operation: every
// decision, delay, retry_after and token count.
//
// Tolerated, because the README documents them:
//  - the integer-ns interval: x/time/rate is given the rate sluice runs at, 1e9 / interval (this also
//    covers rates above 10^9/s, and rate 0, which sluice holds as one token per 2^62/burst ns);
//  - cost > burst is an error in sluice, a refusal in x/time/rate;
//  - time going backwards counts as no time: the oracle gives x/time/rate max(t, its own `last`);
//  - x/time/rate's float64 arithmetic: durations within 2 ns + 1e-12 × burst × interval, token counts
//    within 1e-9 + 1e-12 × (tokens + burst). A decision that flips within that margin (a check a few ns
//    before a token arrives) ends its trace, counted as a rounding tie: the two buckets then differ by
//    one admission.
//  - x/time/rate's oddities listed in the README, each named below, also end their trace.
// Anything else fails, printing the shortest trace (found by dropping operations) that still differs.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "sluice/token_bucket.hpp"

namespace sluice {
namespace {

struct op {
  char kind;           // A try_acquire, R reserve, C cancel, L set_rate, B set_burst, K tokens
  std::int64_t t = 0;  // ns
  std::int64_t n = 0;  // A, R: cost; C: reservation index; B: burst
  double rate = 0;     // L
};

struct trace {
  double rate = 0;
  std::int64_t burst = 0;
  std::vector<op> ops;
};

std::string interval_text(double r, std::int64_t burst) {
  const gcra_params p = make_gcra_params({r}, burst);
  return p.interval_ns == 0 ? "inf" : std::to_string(p.interval_ns);
}

std::string rate_text(double r) {
  if (std::isinf(r)) return "inf";
  std::ostringstream s;
  s.precision(17);
  s << r;
  return s.str();
}

// The oracle's input for one trace. x/time/rate gets sluice's interval (see above).
std::string oracle_input(const trace& tr) {
  std::ostringstream s;
  double r = tr.rate;
  std::int64_t burst = tr.burst;
  s << "T " << interval_text(r, burst) << ' ' << burst << '\n';
  for (const op& o : tr.ops) {
    switch (o.kind) {
      case 'L':
        r = o.rate;
        s << "L " << o.t << ' ' << interval_text(r, burst) << '\n';
        break;
      case 'B':
        burst = o.n;
        s << "B " << o.t << ' ' << burst << ' ' << interval_text(r, burst) << '\n';
        break;
      case 'K': s << "K " << o.t << '\n'; break;
      default: s << o.kind << ' ' << o.t << ' ' << o.n << '\n';
    }
  }
  return s.str();
}

std::string describe(const trace& tr) {
  std::ostringstream s;
  s << "  bucket rate " << rate_text(tr.rate) << "/s burst " << tr.burst << " (interval "
    << interval_text(tr.rate, tr.burst) << " ns)\n";
  int reservations = 0;
  for (std::size_t i = 0; i < tr.ops.size(); ++i) {
    const op& o = tr.ops[i];
    s << "  " << i << ": t=" << o.t << " ns ";
    switch (o.kind) {
      case 'A': s << "try_acquire(" << o.n << ")"; break;
      case 'R': s << "r" << reservations++ << " = reserve(" << o.n << ")"; break;
      case 'C': s << "cancel(r" << o.n << ")"; break;
      case 'L': s << "set_rate(" << rate_text(o.rate) << ")"; break;
      case 'B': s << "set_burst(" << o.n << ")"; break;
      case 'K': s << "tokens()"; break;
    }
    s << '\n';
  }
  return s.str();
}

// Runs the oracle on `input`; one output line per input line.
std::vector<std::string> run_oracle(const std::string& input) {
  static const std::filesystem::path dir = std::filesystem::temp_directory_path();
  const std::filesystem::path in = dir / ("sluice_xtime_" + std::to_string(::getpid()) + ".in");
  std::ofstream(in) << input;
  const std::string command = std::string(SLUICE_XTIME_ORACLE) + " < " + in.string();
  std::vector<std::string> lines;
  if (FILE* f = ::popen(command.c_str(), "r")) {
    std::string line;
    char buffer[4096];
    while (std::fgets(buffer, sizeof buffer, f)) {
      line += buffer;
      if (!line.empty() && line.back() == '\n') {
        line.pop_back();
        lines.push_back(std::move(line));
        line.clear();
      }
    }
    ::pclose(f);
  }
  std::filesystem::remove(in);
  return lines;
}

struct outcome {
  enum kind { same, documented, tie, differs } what = same;
  std::string name;    // documented: which difference; differs: what differed
  std::size_t op = 0;  // where
  std::size_t compared = 0;
};

struct x_answer {
  char kind = 0;
  std::int64_t at = 0;
  int ok = 0;
  double before = 0, after = 0;
  std::int64_t ns = 0;    // A: retry, R: delay
  std::int64_t last = 0;  // the limiter's `last` afterwards
};

x_answer parse(const std::string& line) {
  std::istringstream s(line);
  x_answer x;
  s >> x.kind >> x.at;
  if (x.kind == 'A')
    s >> x.ok >> x.before >> x.after >> x.ns;
  else if (x.kind == 'R')
    s >> x.ok >> x.ns >> x.before >> x.after;
  else
    s >> x.before >> x.after;
  s >> x.last;
  return x;
}

// The tokens sluice holds at `now`, fractions included: when not full, the retry_after of a check
// of the whole burst (refused, so it changes nothing) says how far from full it is.
double exact_tokens(token_bucket& b, time_point now) {
  const gcra_params p = make_gcra_params(b.rate(), b.burst());
  const std::int64_t whole = b.tokens(now);
  if (p.interval_ns == 0 || p.burst == 0 || whole >= p.burst) return static_cast<double>(whole);
  const decision d = b.try_acquire(now, p.burst).value();
  if (d.allowed) return NAN;  // cannot be: fewer than burst tokens
  return static_cast<double>(p.burst) - static_cast<double>(d.retry_after.count()) / static_cast<double>(p.interval_ns);
}

// With it set, compare() prints every operation's answers (used on the shortest failing trace).
bool verbose = false;

// Runs `tr` on sluice and compares with x/time/rate's answers `lines` (the first is the T line).
outcome compare(const trace& tr, const std::vector<std::string>& lines) {
  auto created = token_bucket::create({.rate = {tr.rate}, .burst = tr.burst});
  if (!created) return {outcome::differs, "create failed: " + created.error().message};
  token_bucket b = std::move(created).value();
  if (lines.size() != tr.ops.size() + 1)
    return {outcome::differs, "oracle answered " + std::to_string(lines.size()) + " lines"};
  double r = tr.rate;
  std::int64_t burst = tr.burst;
  std::vector<std::optional<reservation>> reservations;
  std::vector<std::size_t> reserved_at;  // op index of each reservation
  std::vector<bool> gave_back;           // x/time/rate's cancel of it gave something back
  // Tokens sluice may hold less than x/time/rate's float64 count: its state is whole ns of the
  // current interval, so a change of rate or burst, and a cancel, round the tokens down to a ns
  // (and x/time/rate truncates its durations, lastEvent's among them, to a ns).
  // Nothing is lost once the bucket is full (x/time/rate then caps at the burst too).
  double rounded_off = 0;
  std::int64_t x_last = saturating::min;  // x/time/rate's `last` before the operation
  outcome out;
  for (std::size_t i = 0; i < tr.ops.size(); ++i) {
    const op& o = tr.ops[i];
    const x_answer x = parse(lines[i + 1]);
    const time_point now = from_ns(o.t);
    const time_point at = from_ns(x.at);
    const gcra_params p = make_gcra_params({r}, burst);
    const double interval = static_cast<double>(p.interval_ns);
    // x/time/rate's float64 tokens: its error grows with the tokens it adds and takes away.
    const double magnitude = static_cast<double>(burst) + std::abs(x.before) + std::abs(x.after);
    auto ns_close = [&](std::int64_t a, std::int64_t e) {
      return std::abs(static_cast<double>(a) - static_cast<double>(e)) <=
             2 + 1e-11 * magnitude * interval + 1e-15 * std::abs(static_cast<double>(e)) + rounded_off * interval;
    };
    auto tokens_close = [&](double s, double e) {
      const double eps = 1e-9 + 1e-11 * magnitude + rounded_off;
      if (b.rate().is_infinite() || b.burst() == 0)
        return s >= std::floor(e - eps) && s <= std::floor(e + eps);  // whole tokens
      return std::abs(s - e) <= eps;
    };
    auto fail = [&](const std::string& what) {
      std::ostringstream s;
      s << "op " << i << ": " << what << " (x/time/rate evaluated at " << x.at << " ns: " << lines[i + 1] << ")";
      return outcome{outcome::differs, s.str(), i, i};
    };
    if (x.kind != o.kind) return fail("oracle answered another operation");
    // Documented: sluice's arithmetic saturates at 2^63 ns (292 years): a TAT (the time plus the
    // debt) beyond 2^62 ns is near it.
    auto beyond_range = [&](const gcra_params& q) {
      const double at_ns = static_cast<double>(x.at);
      const double tokens = static_cast<double>(q.burst) + std::max(std::abs(x.before), std::abs(x.after));
      return at_ns + std::abs(static_cast<double>(x.ns)) > 0x1p62 ||
             at_ns + tokens * static_cast<double>(q.interval_ns) > 0x1p62;
    };
    const gcra_params next = o.kind == 'L'   ? make_gcra_params({o.rate}, burst)
                             : o.kind == 'B' ? make_gcra_params({r}, o.n)
                                             : p;
    if (beyond_range(p) || beyond_range(next)) {
      return {outcome::documented, "a TAT beyond 2^62 ns (146 years): sluice's int64 ns saturate", i, i};
    }
    const double before = exact_tokens(b, now);
    if (!tokens_close(before, x.before)) {
      return fail("tokens before: sluice " + rate_text(before) + ", x/time/rate " + rate_text(x.before));
    }
    switch (o.kind) {
      case 'A': {
        auto d = b.try_acquire(now, o.n);
        if (!d) {
          // Documented: cost > burst is an error (x/time/rate refuses).
          if (d.error() != errc::cost_exceeds_burst || x.ok || x.ns != -1) return fail("error " + d.error().message);
          break;
        }
        if (d->allowed != (x.ok == 1)) {
          const std::int64_t margin = d->allowed ? x.ns : d->retry_after.count();
          if (ns_close(margin, 0)) return {outcome::tie, "", i, i};
          return fail(std::string("try_acquire: sluice ") + (d->allowed ? "admits" : "refuses") + ", retry_after " +
                      std::to_string(d->retry_after.count()));
        }
        if (!d->allowed) {
          const bool both_never = x.ns == -1 && d->retry_after == never;
          if (!both_never && (x.ns == -1 || !ns_close(d->retry_after.count(), x.ns))) {
            return fail("retry_after: sluice " + std::to_string(d->retry_after.count()) + " ns");
          }
        }
        break;
      }
      case 'R': {
        auto res = b.reserve(now, o.n);
        reservations.push_back(res ? std::optional<reservation>(*res) : std::nullopt);
        reserved_at.push_back(i);
        gave_back.push_back(false);
        if (!res) {
          if (res.error() != errc::cost_exceeds_burst || x.ok) return fail("error " + res.error().message);
          break;
        }
        if (!x.ok) return fail("reserve: sluice reserves, x/time/rate does not");
        if (!ns_close(res->delay_from(at).count(), x.ns)) {
          return fail("delay: sluice " + std::to_string(res->delay_from(at).count()) + " ns");
        }
        break;
      }
      case 'C':
        if (reservations[o.n]) b.cancel(*reservations[o.n], now);
        break;
      case 'L':
        r = o.rate;
        if (auto s = b.set_rate({r}, now); !s) return fail("set_rate: " + s.error().message);
        break;
      case 'B':
        burst = o.n;
        if (auto s = b.set_burst(burst, now); !s) return fail("set_burst: " + s.error().message);
        break;
      case 'K': break;
    }
    if (const gcra_params q = make_gcra_params({r}, burst); q.interval_ns != 0) {
      // 1 ns of sluice's rounding, 1 ns of x/time/rate's truncation; a cancel's in the reservation's
      // interval too (x/time/rate truncates its moment and lastEvent).
      if (o.kind == 'L' || o.kind == 'B') rounded_off += 2.0 / static_cast<double>(q.interval_ns);
      if (o.kind == 'C' && reservations[static_cast<std::size_t>(o.n)] &&
          reservations[static_cast<std::size_t>(o.n)]->interval_ns > 0) {
        rounded_off += 1.0 / static_cast<double>(q.interval_ns) +
                       2.0 / static_cast<double>(reservations[static_cast<std::size_t>(o.n)]->interval_ns);
      }
    }
    const double after = exact_tokens(b, now);
    if (verbose) {
      std::cout << "    " << i << ": sluice tokens " << rate_text(before) << " -> " << rate_text(after)
                << "; x/time/rate " << lines[i + 1] << '\n';
    }
    if (o.kind == 'C' && reservations[static_cast<std::size_t>(o.n)]) {
      // x/time/rate's oddities in CancelAt (README), each recognised where it happens by the
      // tokens x/time/rate gave back (exact in float64, where sluice's are whole at burst 0).
      const std::size_t k = static_cast<std::size_t>(o.n);
      const double given = x.after - x.before;
      const double reserved = static_cast<double>(tr.ops[reserved_at[k]].n);
      const double eps = 1e-9 * (1 + reserved);
      const bool capped = x.after >= static_cast<double>(burst) - 1e-9;
      // Rounding ties: sluice gives back and x/time/rate not, its moment (truncated, so up to 2 ns
      // earlier than sluice's) having passed; or x/time/rate gives back under 2 ns' worth (and
      // records the time) where sluice gives nothing.
      const bool sluice_gave = after > before, x_gave = x.after > x.before || x.last != x_last;
      const std::int64_t moment = to_ns(reservations[k]->time_to_act) - x.at;
      if (sluice_gave && !x_gave && moment >= 0 && moment <= 2) return {outcome::tie, "", i, i};
      if (!sluice_gave && x_gave && std::abs(given) * interval <= 2) return {outcome::tie, "", i, i};
      if (reservations[k]->interval_ns == 0 && given > 0) {
        return {outcome::documented, "cancel of a reservation made at an infinite rate", i, i};
      }
      // (Capped at the burst, it shows as reaching the burst where the reserved tokens alone do not.)
      if ((given > reserved + eps && !capped) || (capped && x.before + reserved < static_cast<double>(burst) - eps)) {
        return {outcome::documented, "x/time/rate's cancel gives back more than was reserved", i, i};
      }
      // After a cancel that gave back, x/time/rate's lastEvent may still be the cancelled one's
      // moment (it moves only when the latest is cancelled, and then not before now).
      bool given_back_before = false;
      for (std::size_t q = 0; q < gave_back.size(); ++q)
        given_back_before = given_back_before || (q != k && gave_back[q]);
      // (At burst 0 sluice's tokens are whole, so a difference may not show yet.)
      if (given_back_before && !capped && given < reserved - eps && (burst == 0 || !tokens_close(after, x.after))) {
        return {outcome::documented, "x/time/rate keeps a cancelled reservation's place", i, i};
      }
    }
    if (!tokens_close(after, x.after)) {
      return fail("tokens after: sluice " + rate_text(after) + ", x/time/rate " + rate_text(x.after));
    }
    if (o.kind == 'C' && x.after > x.before) gave_back[static_cast<std::size_t>(o.n)] = true;
    if (after >= static_cast<double>(burst) && x.after >= static_cast<double>(burst) - 1e-9) {
      // Full from a write on: later operations are evaluated no earlier (time going back is no time).
      // (At an infinite rate x/time/rate records nothing for a check.)
      const bool wrote = o.kind == 'L' || o.kind == 'B' ||
                         ((o.kind == 'A' || o.kind == 'R') && x.ok && !std::isinf(r)) ||
                         (o.kind == 'C' && x.after != x.before);
      if (wrote) rounded_off = 0;
    }
    x_last = x.last;
    out.compared = i + 1;
  }
  return out;
}

// Drops operations while the trace still differs (cancels go with their reservation).
trace minimise(trace tr) {
  for (bool shrunk = true; shrunk;) {
    shrunk = false;
    for (std::size_t i = tr.ops.size(); i-- > 0;) {
      trace t = tr;
      if (t.ops[i].kind == 'R') {
        std::int64_t k = 0;
        for (std::size_t j = 0; j < i; ++j) k += t.ops[j].kind == 'R';
        std::vector<op> kept;
        for (std::size_t j = 0; j < t.ops.size(); ++j) {
          op o = t.ops[j];
          if (j == i || (o.kind == 'C' && o.n == k)) continue;
          if (o.kind == 'C' && o.n > k) --o.n;
          kept.push_back(o);
        }
        t.ops = std::move(kept);
      } else {
        t.ops.erase(t.ops.begin() + static_cast<std::ptrdiff_t>(i));
      }
      if (compare(t, run_oracle(oracle_input(t))).what == outcome::differs) {
        tr = std::move(t);
        shrunk = true;
      }
    }
  }
  return tr;
}

// --- traces ---------------------------------------------------------------------------------------

double random_rate(std::mt19937_64& rng) {
  const int pick = static_cast<int>(rng() % 100);
  if (pick < 5) return INFINITY;
  if (pick < 8) return 0;
  if (pick < 20) {
    constexpr double nice[] = {1e9, 1e8, 1e6, 1000, 10, 5, 1, 0.5, 1e-6, 3, 7, 1e9 / 1100, 2.5e8, 3e8};
    return nice[rng() % std::size(nice)];
  }
  return std::pow(10.0, std::uniform_real_distribution<double>(-6, 9)(rng));
}

std::int64_t random_burst(std::mt19937_64& rng) {
  const int pick = static_cast<int>(rng() % 100);
  if (pick < 4) return 0;
  if (pick < 45) return 1 + static_cast<std::int64_t>(rng() % 10);
  if (pick < 75) return 11 + static_cast<std::int64_t>(rng() % 90);
  return static_cast<std::int64_t>(std::pow(10.0, std::uniform_real_distribution<double>(2, 4)(rng)));
}

trace random_trace(std::mt19937_64& rng) {
  trace tr{.rate = random_rate(rng), .burst = random_burst(rng)};
  double r = tr.rate;
  std::int64_t burst = tr.burst;
  std::int64_t t = static_cast<std::int64_t>(rng() % 1'000'000'000);
  std::vector<std::int64_t> open;  // reservations not yet cancelled
  std::int64_t reservations = 0;
  const int length = 20 + static_cast<int>(rng() % 180);
  for (int i = 0; i < length; ++i) {
    // Time: standing still, small and large steps in units of the interval, going back.
    const gcra_params p = make_gcra_params({r}, burst);
    const double unit = p.interval_ns == 0 ? 1e6 : static_cast<double>(p.interval_ns);
    const double span = std::max(unit, static_cast<double>(p.tolerance_ns));
    std::uniform_real_distribution<double> u(0, 1);
    const int step = static_cast<int>(rng() % 100);
    double dt = 0;
    if (step < 30)
      dt = 0;
    else if (step < 55)
      dt = u(rng) * 2 * unit;
    else if (step < 65)
      dt = std::round(u(rng) * 4) * unit;  // exactly when tokens arrive
    else if (step < 80)
      dt = u(rng) * span;
    else if (step < 88)
      dt = -u(rng) * std::min(static_cast<double>(t), 2 * span);
    else if (step < 93)
      dt = static_cast<double>(1 + rng() % 3);
    else
      dt = u(rng) * 3 * span;
    t = std::clamp<std::int64_t>(t + std::llround(std::clamp(dt, -4e18, 4e18)), 0, std::int64_t{1} << 58);

    const int kind = static_cast<int>(rng() % 100);
    auto cost = [&] {
      const std::int64_t cap = std::max<std::int64_t>(burst, 1);
      const int c = static_cast<int>(rng() % 100);
      if (c < 60) return std::int64_t{1};
      if (c < 95) return 1 + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(cap));
      return cap + 1 + static_cast<std::int64_t>(rng() % 3);  // more than the burst
    };
    if (kind < 40) {
      tr.ops.push_back({'A', t, cost()});
    } else if (kind < 58) {
      tr.ops.push_back({'R', t, cost()});
      open.push_back(reservations++);
    } else if (kind < 72 && !open.empty()) {
      // In order (the latest) or out of order (any).
      const std::size_t pick = rng() % 2 ? open.size() - 1 : rng() % open.size();
      tr.ops.push_back({'C', t, open[pick]});
      open.erase(open.begin() + static_cast<std::ptrdiff_t>(pick));
    } else if (kind < 80) {
      r = rng() % 4 == 0 ? random_rate(rng) : r * std::pow(2.0, std::uniform_real_distribution<double>(-3, 3)(rng));
      if (r > 0 && r < 1e-6) r = 1e-6;
      tr.ops.push_back({'L', t, 0, r});
      if (rng() % 4 == 0) {  // and back at the same instant, or via an infinite rate
        const double back = tr.ops.size() > 1 && rng() % 2 ? INFINITY : r;
        tr.ops.push_back({'L', t, 0, back});
        tr.ops.push_back({'L', t, 0, r});
      }
    } else if (kind < 88) {
      burst = rng() % 3 == 0 ? random_burst(rng)
                             : std::max<std::int64_t>(0, burst + static_cast<std::int64_t>(rng() % 7) - 3);
      tr.ops.push_back({'B', t, burst});
    } else {
      tr.ops.push_back({'K', t});
    }
  }
  return tr;
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

TEST(TokenBucketDifferential, AgreesWithXTimeRate) {
  ASSERT_TRUE(std::filesystem::exists(SLUICE_XTIME_ORACLE))
      << "the x/time/rate oracle was not built (" << SLUICE_XTIME_ORACLE
      << "): install golang-go and golang-golang-x-time-dev (scripts/deps), then reconfigure";
  const auto start = std::chrono::steady_clock::now();
  const int count = env_int("SLUICE_DIFFERENTIAL_TRACES", 3000);
  const auto seed = static_cast<std::uint64_t>(env_int("SLUICE_DIFFERENTIAL_SEED", 9));
  std::mt19937_64 rng(seed);
  std::vector<trace> traces;
  std::string input;
  for (int i = 0; i < count; ++i) {
    traces.push_back(random_trace(rng));
    input += oracle_input(traces.back());
  }
  const std::vector<std::string> lines = run_oracle(input);
  ASSERT_FALSE(lines.empty()) << "the oracle answered nothing";

  std::size_t at = 0, ops = 0, compared = 0, ties = 0, effective_rate = 0;
  std::map<std::string, int> documented;
  for (const trace& tr : traces) {
    const std::size_t n = tr.ops.size() + 1;
    ASSERT_LE(at + n, lines.size()) << "the oracle stopped early";
    const std::vector<std::string> mine(lines.begin() + static_cast<std::ptrdiff_t>(at),
                                        lines.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += n;
    ops += tr.ops.size();
    bool rate_differs =
        !std::isinf(tr.rate) && 1e9 / static_cast<double>(make_gcra_params({tr.rate}, tr.burst).interval_ns) != tr.rate;
    for (const op& o : tr.ops)
      rate_differs = rate_differs || (o.kind == 'L' && !std::isinf(o.rate) && o.rate != 1e9 / std::round(1e9 / o.rate));
    effective_rate += rate_differs;
    const outcome out = compare(tr, mine);
    compared += out.what == outcome::same ? tr.ops.size() : out.compared;
    if (out.what == outcome::tie) ++ties;
    if (out.what == outcome::documented) ++documented[out.name];
    if (out.what == outcome::differs) {
      const trace small = minimise(tr);
      verbose = true;
      std::cout << "the shortest trace, operation by operation:\n";
      const outcome why = compare(small, run_oracle(oracle_input(small)));
      verbose = false;
      FAIL() << "sluice and x/time/rate differ, an undocumented difference:\n  " << out.name
             << "\nshortest trace that still differs:\n"
             << describe(small) << "  -> " << why.name;
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << traces.size() << " traces (seed " << seed << "), " << ops << " operations, " << compared
            << " compared, in " << seconds << " s\n"
            << "  integer-ns interval: " << effective_rate << " traces ran at 1e9/interval, not the rate asked\n"
            << "  rounding ties (a decision within float64 rounding of the boundary): " << ties << " traces ended\n";
  for (const auto& [name, n] : documented)
    std::cout << "  documented difference \"" << name << "\": " << n << " traces ended\n";
}

}  // namespace
}  // namespace sluice
