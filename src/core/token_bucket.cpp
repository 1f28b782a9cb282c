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

namespace {

void store(auto& slot, const gcra_params& p, rate r) noexcept {
  slot.interval_ns.store(p.interval_ns, std::memory_order_relaxed);
  slot.burst.store(p.burst, std::memory_order_relaxed);
  slot.tolerance_ns.store(p.tolerance_ns, std::memory_order_relaxed);
  slot.rate.store(r.per_second, std::memory_order_relaxed);
}

result<void> check_cost(const gcra_params& p, std::int64_t cost) noexcept {
  return validate_cost(cost, p.interval_ns == 0 ? 0 : p.burst, "burst");
}

}  // namespace

result<token_bucket> token_bucket::create(const options& o) {
  if (auto v = validate(token_bucket_policy(o.rate, o.burst)); !v) return v.error();
  if (o.clock == nullptr) return {errc::invalid_argument, "clock must not be null"};
  return token_bucket(o);
}

token_bucket::token_bucket(const options& o) : word_(pack(gcra_state::empty_tat, 0)), clock_(o.clock) {
  store(slots_[0], make_gcra_params(o.rate, o.burst), o.rate);
}

token_bucket::token_bucket(token_bucket&& other) noexcept : word_(other.word_.load()), clock_(other.clock_) {
  for (std::size_t i = 0; i <= generation_mask; ++i) {
    const params_slot& from = other.slots_[i];
    store(slots_[i], {from.interval_ns.load(), from.burst.load(), from.tolerance_ns.load()}, {from.rate.load()});
  }
}

gcra_params token_bucket::params_of(std::int64_t word) const noexcept {
  const params_slot& s = slots_[generation_of(word)];
  return {s.interval_ns.load(std::memory_order_relaxed), s.burst.load(std::memory_order_relaxed),
          s.tolerance_ns.load(std::memory_order_relaxed)};
}

sluice::rate token_bucket::rate() const noexcept {
  return {slots_[generation_of(word_.load(std::memory_order_acquire))].rate.load(std::memory_order_relaxed)};
}

std::int64_t token_bucket::burst() const noexcept { return params_of(word_.load(std::memory_order_acquire)).burst; }

// Every update below is a compare-and-swap loop on word_: acquire on load so the parameter slot the
// word names is visible, release on swap so a changed slot is published with the word.

result<decision> token_bucket::try_acquire(time_point now, std::int64_t cost) noexcept {
  const std::int64_t now_ns = to_ns(now);
  std::int64_t word = word_.load(std::memory_order_acquire);
  for (;;) {
    const gcra_params p = params_of(word);
    if (auto c = check_cost(p, cost); !c) return c.error();
    const gcra_state s{tat_of(word)};
    const decision d = s.evaluate(p, now_ns, cost);
    if (!d.allowed || p.interval_ns == 0) {
      // Nothing to write; the answer stands if the word (hence its parameters) did not move.
      const std::int64_t again = word_.load(std::memory_order_acquire);
      if (again == word) return d;
      word = again;
      continue;
    }
    const std::int64_t next = pack(gcra_state::next_tat(s.tat, p, now_ns, cost), generation_of(word));
    if (word_.compare_exchange_weak(word, next, std::memory_order_acq_rel, std::memory_order_acquire)) return d;
  }
}

result<reservation> token_bucket::reserve_until(time_point now, std::int64_t cost, time_point latest) noexcept {
  const std::int64_t now_ns = to_ns(now);
  std::int64_t word = word_.load(std::memory_order_acquire);
  for (;;) {
    const gcra_params p = params_of(word);
    if (auto c = check_cost(p, cost); !c) return c.error();
    if (p.interval_ns == 0) return reservation{.tokens = cost, .time_to_act = now, .tat_after = gcra_state::empty_tat};
    if (p.burst == 0) return {errc::cost_exceeds_burst, "burst is 0: tokens can never be reserved"};
    const std::int64_t tat_after = gcra_state::next_tat(tat_of(word), p, now_ns, cost);
    const std::int64_t act = std::max(now_ns, saturating::sub(tat_after, p.tolerance_ns));
    if (act > to_ns(latest)) {
      return {errc::deadline_exceeded,
              "tokens would be available only " + std::to_string(act - now_ns) + " ns from now, after the deadline"};
    }
    const std::int64_t next = pack(tat_after, generation_of(word));
    if (word_.compare_exchange_weak(word, next, std::memory_order_acq_rel, std::memory_order_acquire)) {
      return reservation{.tokens = cost, .time_to_act = from_ns(act), .tat_after = tat_of(next)};
    }
  }
}

result<reservation> token_bucket::reserve(time_point now, std::int64_t cost) noexcept {
  return reserve_until(now, cost, time_point::max());
}

void token_bucket::cancel(const reservation& r, time_point now) noexcept {
  if (r.tokens <= 0 || now >= r.time_to_act) return;
  std::int64_t word = word_.load(std::memory_order_acquire);
  for (;;) {
    const gcra_params p = params_of(word);
    if (p.interval_ns == 0) return;
    // Tokens reserved after this reservation keep their place: give back only the rest.
    const std::int64_t cur = tat_of(word);
    const std::int64_t reserved_later = std::max<std::int64_t>(0, saturating::sub(cur, r.tat_after));
    const std::int64_t restore = saturating::sub(saturating::mul(r.tokens, p.interval_ns), reserved_later);
    if (restore <= 0) return;
    const std::int64_t next = pack(saturating::sub(cur, restore), generation_of(word));
    if (word_.compare_exchange_weak(word, next, std::memory_order_acq_rel, std::memory_order_acquire)) return;
  }
}

result<void> token_bucket::wait(std::int64_t cost, time_point deadline, std::stop_token stop) {
  if (stop.stop_requested()) return {errc::cancelled, "wait cancelled before it started"};
  const time_point now = clock_->now();
  auto r = reserve_until(now, cost, deadline);
  if (!r) return r.error();
  if (r->time_to_act <= now) return {};
  if (!clock_->sleep_until(r->time_to_act, std::move(stop))) {
    cancel(*r, clock_->now());
    return {errc::cancelled, "wait cancelled"};
  }
  return {};
}

std::int64_t token_bucket::tokens(time_point now) const noexcept {
  const std::int64_t word = word_.load(std::memory_order_acquire);
  const gcra_params p = params_of(word);
  if (p.interval_ns == 0) return p.burst;
  const std::int64_t debt = std::max<std::int64_t>(0, saturating::sub(tat_of(word), to_ns(now)));
  return saturating::floor_div(saturating::sub(p.tolerance_ns, debt), p.interval_ns);
}

result<void> token_bucket::change(std::optional<sluice::rate> new_rate, std::optional<std::int64_t> new_burst,
                                  time_point now) {
  std::lock_guard lock(change_mutex_);
  const sluice::rate r = new_rate.value_or(rate());
  const std::int64_t burst = new_burst.value_or(this->burst());
  if (auto v = validate(token_bucket_policy(r, burst)); !v) return v;
  const gcra_params new_p = make_gcra_params(r, burst);
  const std::int64_t now_ns = to_ns(now);
  std::int64_t word = word_.load(std::memory_order_acquire);
  // The next slot is not current, so no check reads it as current while it is written.
  const std::size_t next_generation = (generation_of(word) + 1) & generation_mask;
  store(slots_[next_generation], new_p, r);
  for (;;) {
    // Keep the (fractional) tokens held at `now`; a full or over-full bucket stays full.
    const gcra_params old_p = params_of(word);
    double held = static_cast<double>(old_p.burst);
    if (old_p.interval_ns != 0) {
      const double debt = static_cast<double>(std::max<std::int64_t>(0, saturating::sub(tat_of(word), now_ns)));
      held = (static_cast<double>(old_p.tolerance_ns) - debt) / static_cast<double>(old_p.interval_ns);
    }
    std::int64_t tat = gcra_state::empty_tat;
    const double deficit = static_cast<double>(new_p.burst) - held;
    if (new_p.interval_ns != 0 && deficit > 0) {
      const double debt_ns = std::min(deficit * static_cast<double>(new_p.interval_ns), 2.0 * gcra_max_tolerance_ns);
      tat = saturating::add(now_ns, std::llround(debt_ns));
    }
    if (word_.compare_exchange_weak(word, pack(tat, next_generation), std::memory_order_acq_rel,
                                    std::memory_order_acquire)) {
      return {};
    }
  }
}

result<void> token_bucket::set_rate(sluice::rate r, time_point now) { return change(r, std::nullopt, now); }

result<void> token_bucket::set_burst(std::int64_t b, time_point now) { return change(std::nullopt, b, now); }

}  // namespace sluice
