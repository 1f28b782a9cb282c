#include "sluice/token_bucket.hpp"

#include <cmath>

namespace sluice {

gcra_params make_gcra_params(rate r, std::int64_t burst) noexcept {
  gcra_params p;
  p.burst = burst;
  if (r.is_infinite()) return p;  // interval 0: admit everything
  std::int64_t max_interval = gcra_max_tolerance_ns / std::max<std::int64_t>(burst, 1);
  double interval = r.per_second > 0 ? 1e9 / r.per_second : INFINITY;
  p.interval_ns = interval >= static_cast<double>(max_interval)
                      ? max_interval
                      : std::max<std::int64_t>(1, std::llround(interval));
  p.tolerance_ns = p.interval_ns * burst;  // <= gcra_max_tolerance_ns by the clamp above
  return p;
}

result<token_bucket> token_bucket::create(const options& o) {
  if (auto v = validate(token_bucket_policy(o.rate, o.burst)); !v) return v.error();
  if (o.clock == nullptr) return {errc::invalid_argument, "clock must not be null"};
  return token_bucket(o);
}

token_bucket::token_bucket(const options& o) : clock_(o.clock) {
  gcra_params p = make_gcra_params(o.rate, o.burst);
  interval_.store(p.interval_ns, std::memory_order_relaxed);
  burst_.store(p.burst, std::memory_order_relaxed);
  tolerance_.store(p.tolerance_ns, std::memory_order_relaxed);
  rate_.store(o.rate.per_second, std::memory_order_relaxed);
}

token_bucket::token_bucket(token_bucket&& other) noexcept
    : tat_(other.tat_.load()),
      interval_(other.interval_.load()),
      burst_(other.burst_.load()),
      tolerance_(other.tolerance_.load()),
      rate_(other.rate_.load()),
      clock_(other.clock_) {}

sluice::rate token_bucket::rate() const noexcept { return {rate_.load(std::memory_order_relaxed)}; }

result<void> token_bucket::check_cost(const gcra_params& p, std::int64_t cost) const noexcept {
  return validate_cost(cost, p.interval_ns == 0 ? 0 : p.burst, "burst");
}

result<decision> token_bucket::try_acquire(time_point now, std::int64_t cost) noexcept {
  const gcra_params p = params();
  if (auto c = check_cost(p, cost); !c) return c.error();
  const std::int64_t now_ns = to_ns(now);
  gcra_state s{tat_.load(std::memory_order_relaxed)};
  for (;;) {
    decision d = s.evaluate(p, now_ns, cost);
    if (!d.allowed || p.interval_ns == 0) return d;
    // Relaxed suffices: the word is the whole state and publishes nothing else.
    if (tat_.compare_exchange_weak(s.tat, gcra_state::next_tat(s.tat, p, now_ns, cost), std::memory_order_relaxed)) {
      return d;
    }
  }
}

namespace {

// Reserves `cost` tokens unless they would only be available after `latest`.
result<reservation> reserve_until(std::atomic<std::int64_t>& tat, const gcra_params& p, std::int64_t now,
                                  std::int64_t cost, std::int64_t latest) noexcept {
  std::int64_t cur = tat.load(std::memory_order_relaxed);
  for (;;) {
    std::int64_t next = gcra_state::next_tat(cur, p, now, cost);
    std::int64_t act = std::max(now, saturating::sub(next, p.tolerance_ns));
    if (act > latest) {
      return {errc::deadline_exceeded, "tokens would be available only " + std::to_string(act - now) +
                                           " ns from now, after the deadline"};
    }
    if (tat.compare_exchange_weak(cur, next, std::memory_order_relaxed)) {
      return reservation{.tokens = cost, .time_to_act = from_ns(act), .tat_after = next};
    }
  }
}

}  // namespace

result<reservation> token_bucket::reserve(time_point now, std::int64_t cost) noexcept {
  const gcra_params p = params();
  if (auto c = check_cost(p, cost); !c) return c.error();
  if (p.interval_ns == 0) return reservation{.tokens = cost, .time_to_act = now, .tat_after = gcra_state::empty_tat};
  if (p.burst == 0) return {errc::cost_exceeds_burst, "burst is 0: tokens can never be reserved"};
  return reserve_until(tat_, p, to_ns(now), cost, saturating::max);
}

void token_bucket::cancel(const reservation& r, time_point now) noexcept {
  const gcra_params p = params();
  if (r.tokens <= 0 || p.interval_ns == 0 || now >= r.time_to_act) return;
  std::int64_t cur = tat_.load(std::memory_order_relaxed);
  for (;;) {
    // Tokens reserved after this reservation keep their place: give back only the rest.
    std::int64_t reserved_later = std::max<std::int64_t>(0, saturating::sub(cur, r.tat_after));
    std::int64_t restore = saturating::sub(saturating::mul(r.tokens, p.interval_ns), reserved_later);
    if (restore <= 0) return;
    if (tat_.compare_exchange_weak(cur, saturating::sub(cur, restore), std::memory_order_relaxed)) return;
  }
}

result<void> token_bucket::wait(std::int64_t cost, time_point deadline, std::stop_token stop) {
  if (stop.stop_requested()) return {errc::cancelled, "wait cancelled before it started"};
  const gcra_params p = params();
  if (auto c = check_cost(p, cost); !c) return c;
  if (p.interval_ns == 0) return {};
  if (p.burst == 0) return {errc::deadline_exceeded, "burst is 0: tokens never become available"};
  const time_point now = clock_->now();
  auto r = reserve_until(tat_, p, to_ns(now), cost, to_ns(deadline));
  if (!r) return r.error();
  if (r->time_to_act <= now) return {};
  if (!clock_->sleep_until(r->time_to_act, std::move(stop))) {
    cancel(*r, clock_->now());
    return {errc::cancelled, "wait cancelled"};
  }
  return {};
}

std::int64_t token_bucket::tokens(time_point now) const noexcept {
  const gcra_params p = params();
  if (p.interval_ns == 0) return p.burst;
  std::int64_t debt = std::max<std::int64_t>(0, saturating::sub(tat_.load(std::memory_order_relaxed), to_ns(now)));
  return saturating::floor_div(saturating::sub(p.tolerance_ns, debt), p.interval_ns);
}

result<void> token_bucket::change(std::optional<sluice::rate> new_rate, std::optional<std::int64_t> new_burst,
                                  time_point now) {
  std::lock_guard lock(change_mutex_);
  const sluice::rate r = new_rate.value_or(rate());
  const std::int64_t burst = new_burst.value_or(this->burst());
  if (auto v = validate(token_bucket_policy(r, burst)); !v) return v;
  const gcra_params old_p = params();
  const gcra_params new_p = make_gcra_params(r, burst);
  const std::int64_t now_ns = to_ns(now);
  interval_.store(new_p.interval_ns, std::memory_order_relaxed);
  burst_.store(new_p.burst, std::memory_order_relaxed);
  tolerance_.store(new_p.tolerance_ns, std::memory_order_relaxed);
  rate_.store(r.per_second, std::memory_order_relaxed);
  std::int64_t cur = tat_.load(std::memory_order_relaxed);
  for (;;) {
    // Keep the (fractional) tokens held at `now`; a full or over-full bucket stays full.
    double held = static_cast<double>(old_p.burst);
    if (old_p.interval_ns != 0) {
      double debt = static_cast<double>(std::max<std::int64_t>(0, saturating::sub(cur, now_ns)));
      held = (static_cast<double>(old_p.tolerance_ns) - debt) / static_cast<double>(old_p.interval_ns);
    }
    std::int64_t next = gcra_state::empty_tat;
    double deficit = static_cast<double>(new_p.burst) - held;
    if (new_p.interval_ns != 0 && deficit > 0) {
      double debt_ns = std::min(deficit * static_cast<double>(new_p.interval_ns), 2.0 * gcra_max_tolerance_ns);
      next = saturating::add(now_ns, std::llround(debt_ns));
    }
    if (tat_.compare_exchange_weak(cur, next, std::memory_order_relaxed)) return {};
  }
}

result<void> token_bucket::set_rate(sluice::rate r, time_point now) { return change(r, std::nullopt, now); }

result<void> token_bucket::set_burst(std::int64_t b, time_point now) { return change(std::nullopt, b, now); }

}  // namespace sluice
