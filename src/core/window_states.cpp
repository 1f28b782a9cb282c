// SPDX-License-Identifier: Apache-2.0
#include "sluice/window_states.hpp"

#include <chrono>
#include <limits>

namespace sluice {

using saturating::floor_div;

__extension__ using int128 = __int128;  // exact products of counts and nanoseconds

// --- sliding window log -----------------------------------------------------------------------------

void sliding_window_log_state::expire(const window_params& p, std::int64_t now) {
  // Entries at or before now − W have left the window (now − W, now].
  const std::int64_t cutoff = saturating::sub(now, p.window_ns);
  auto first_live = std::upper_bound(entries_.begin() + static_cast<std::ptrdiff_t>(head_), entries_.end(), cutoff,
                                     [](std::int64_t t, const entry& e) { return t < e.time; });
  const auto first = static_cast<std::size_t>(first_live - entries_.begin());
  if (first == entries_.size()) {
    entries_.clear();
    head_ = 0;
    base_ = 0;
    return;
  }
  if (first > head_) {
    base_ = entries_[first - 1].total;
    head_ = first;
  }
  // Totals are at most base_ + limit; keep that within 64 bits (only enormous limits get here).
  if (base_ > std::numeric_limits<std::int64_t>::max() - p.limit) {
    entries_.erase(entries_.begin(), entries_.begin() + static_cast<std::ptrdiff_t>(head_));
    head_ = 0;
    for (entry& e : entries_) e.total -= base_;
    base_ = 0;
  }
}

decision sliding_window_log_state::evaluate(const window_params& p, std::int64_t now, std::int64_t cost) {
  now = effective_now(now);
  expire(p, now);
  const std::int64_t live = live_units();
  decision d;
  d.limit = p.limit;
  if (cost <= p.limit - live) {  // not live + cost: limits up to 2^63 − 1 must not overflow
    d.allowed = true;
    d.remaining = p.limit - live - cost;
    d.reset_after = nanoseconds(p.window_ns);  // the newest entry will be `now`
    return d;
  }
  // The (live + cost − limit)-th oldest unit must leave the window first: it belongs to the first
  // entry whose running total reaches base_ + that many.
  const std::int64_t must_expire = cost - (p.limit - live);
  const std::int64_t unit = base_ + must_expire;
  auto holder = std::lower_bound(entries_.begin() + static_cast<std::ptrdiff_t>(head_), entries_.end(), unit,
                                 [](const entry& e, std::int64_t u) { return e.total < u; });
  d.remaining = p.limit - live;
  d.retry_after = nanoseconds(saturating::sub(saturating::add(holder->time, p.window_ns), now));
  d.reset_after = nanoseconds(saturating::sub(saturating::add(entries_.back().time, p.window_ns), now));
  return d;
}

void sliding_window_log_state::commit(const window_params& p, std::int64_t now, std::int64_t cost) {
  now = effective_now(now);
  expire(p, now);
  if (size() > 0 && entries_.back().time == now) {  // same instant: they expire together
    entries_.back().total += cost;
    return;
  }
  // Drop the expired prefix once it is the larger part, keeping memory within about 2 × live.
  if (head_ >= 32 && head_ * 2 >= entries_.size()) {
    entries_.erase(entries_.begin(), entries_.begin() + static_cast<std::ptrdiff_t>(head_));
    head_ = 0;
  }
  const std::int64_t before = size() > 0 ? entries_.back().total : base_;
  entries_.push_back({now, before + cost});
}

std::int64_t sliding_window_log_state::idle_at(const window_params& p) const noexcept {
  return size() == 0 ? saturating::min : saturating::add(entries_.back().time, p.window_ns);
}

// --- shared by the counters -------------------------------------------------------------------------

namespace {

struct window_position {
  std::int64_t now;      // max(now, last_now): time never goes backwards
  std::int64_t index;    // floor(now / W)
  std::int64_t elapsed;  // now − index × W, in [0, W)
  std::int64_t steps;    // windows passed since last_now's window (0, 1, or 2 meaning "2 or more")
};

window_position locate(const window_params& p, std::int64_t last_now, std::int64_t now) noexcept {
  window_position w;
  w.now = std::max(now, last_now);
  w.index = floor_div(w.now, p.window_ns);
  w.elapsed = saturating::sub(w.now, saturating::mul(w.index, p.window_ns));
  const std::int64_t last_index = floor_div(last_now, p.window_ns);  // <= w.index
  w.steps = w.index == last_index ? 0 : (last_index + 1 == w.index ? 1 : 2);
  return w;
}

}  // namespace

// --- sliding window counter -------------------------------------------------------------------------

decision sliding_window_counter_state::evaluate(const window_params& p, std::int64_t now,
                                                std::int64_t cost) const noexcept {
  const window_position w = locate(p, last_now, now);
  const std::int64_t cur = w.steps == 0 ? current : 0;
  const std::int64_t prev = w.steps == 0 ? previous : (w.steps == 1 ? current : 0);
  const int128 W = p.window_ns;
  const int128 weight = W - w.elapsed;  // previous window's overlap with (now − W, now], in ns
  // All comparisons scaled by W, in 128 bits: exact, no overflow.
  const int128 estimate_after = prev * weight + (static_cast<int128>(cur) + cost) * W;
  const int128 capacity = static_cast<int128>(p.limit) * W;
  decision d;
  d.limit = p.limit;
  d.allowed = estimate_after <= capacity;
  const int128 left = d.allowed ? capacity - estimate_after : capacity - (prev * weight + static_cast<int128>(cur) * W);
  d.remaining = left <= 0 ? 0 : static_cast<std::int64_t>(left / W);
  const std::int64_t cur_after = d.allowed ? cur + cost : cur;
  const std::int64_t to_window_end = p.window_ns - w.elapsed;
  // Full again when both windows are empty: the end of the next window if this one has admissions.
  d.reset_after =
      nanoseconds(cur_after > 0 ? saturating::add(to_window_end, p.window_ns) : (prev > 0 ? to_window_end : 0));
  if (d.allowed) return d;
  if (cost <= p.limit - cur) {
    // Within this window, once the previous window's weight has fallen far enough:
    // prev × (W − e) <= (limit − cur − cost) × W  ⇔  e >= W − (limit − cur − cost) × W / prev.
    const int128 slack = static_cast<int128>(p.limit - cur - cost) * W;
    const int128 e_needed = W - slack / prev;  // prev > 0 here, else it would be allowed
    d.retry_after = nanoseconds(static_cast<std::int64_t>(e_needed - w.elapsed));
  } else {
    // In the next window, where `cur` becomes the previous one: cur × (W − e) <= (limit − cost) × W.
    const int128 slack = static_cast<int128>(p.limit - cost) * W;
    const int128 e_needed = cur > 0 ? std::max<int128>(0, W - slack / cur) : 0;
    d.retry_after = nanoseconds(to_window_end + static_cast<std::int64_t>(e_needed));
  }
  if (d.retry_after <= nanoseconds::zero()) d.retry_after = nanoseconds(1);
  return d;
}

void sliding_window_counter_state::commit(const window_params& p, std::int64_t now, std::int64_t cost) noexcept {
  const window_position w = locate(p, last_now, now);
  if (w.steps == 1) {
    previous = current;
    current = 0;
  } else if (w.steps == 2) {
    previous = 0;
    current = 0;
  }
  current += cost;
  last_now = w.now;
}

std::int64_t sliding_window_counter_state::idle_at(const window_params& p) const noexcept {
  if (current == 0 && previous == 0) return saturating::min;
  // The end of the window after last_now's window.
  const std::int64_t index = floor_div(last_now, p.window_ns);
  return saturating::mul(saturating::add(index, current > 0 ? 2 : 1), p.window_ns);
}

// --- fixed window -----------------------------------------------------------------------------------

window_period fixed_period(const window_params& p, std::int64_t t) noexcept {
  using namespace std::chrono;
  constexpr std::int64_t day_ns = duration_cast<nanoseconds>(days(1)).count();
  // Weeks since the epoch start on Thursdays; ISO weeks 4 days later, on Mondays (1970-01-05).
  const std::int64_t shift = p.calendar == calendar::week ? 4 * day_ns : 0;
  if (p.calendar != calendar::month) {
    const std::int64_t start =
        saturating::add(saturating::mul(floor_div(saturating::sub(t, shift), p.window_ns), p.window_ns), shift);
    return {start, saturating::add(start, p.window_ns)};
  }
  const year_month_day date{sys_days(days(floor_div(t, day_ns)))};
  const year_month month = date.year() / date.month();
  auto first_day_ns = [&](year_month m) {
    return saturating::mul(sys_days(m / 1).time_since_epoch().count(), day_ns);
  };
  return {first_day_ns(month), first_day_ns(month + months(1))};
}

decision fixed_window_state::evaluate(const window_params& p, std::int64_t now, std::int64_t cost) const noexcept {
  now = std::max(now, last_now);  // time never goes backwards
  const window_period w = fixed_period(p, now);
  const std::int64_t used = fixed_period(p, last_now).start == w.start ? count : 0;
  const std::int64_t to_window_end = w.end - now;
  decision d;
  d.limit = p.limit;
  d.allowed = cost <= p.limit - used;
  const std::int64_t used_after = d.allowed ? used + cost : used;
  d.remaining = p.limit - used_after;
  d.reset_after = nanoseconds(used_after > 0 ? to_window_end : 0);
  if (!d.allowed) d.retry_after = nanoseconds(to_window_end);
  return d;
}

void fixed_window_state::commit(const window_params& p, std::int64_t now, std::int64_t cost) noexcept {
  now = std::max(now, last_now);
  if (fixed_period(p, last_now).start != fixed_period(p, now).start) count = 0;
  count += cost;
  last_now = now;
}

std::int64_t fixed_window_state::idle_at(const window_params& p) const noexcept {
  if (count == 0) return saturating::min;
  return fixed_period(p, last_now).end;
}

}  // namespace sluice
