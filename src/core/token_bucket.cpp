// SPDX-License-Identifier: Apache-2.0
#include "sluice/token_bucket.hpp"

#include <cmath>
#include <string>

namespace sluice {

namespace {
__extension__ using int128 = __int128;  // products of ns and intervals
}  // namespace

namespace {

constexpr auto relaxed = std::memory_order_relaxed;

result<void> check_cost(const gcra_params& p, std::int64_t cost) noexcept {
  return validate_cost(cost, p.interval_ns == 0 ? 0 : p.burst, "burst");
}

__extension__ using int128 = __int128;

// An admission or a reservation sets x/time/rate's lastEvent (see block).
void mark_written(auto& b) noexcept {
  if (!b.written.load(relaxed)) b.written.store(true, relaxed);
}

std::int64_t clamp_to_int64(int128 v) noexcept {
  if (v > saturating::max) return saturating::max;
  if (v < saturating::min) return saturating::min;
  return static_cast<std::int64_t>(v);
}

// `ns` measured in intervals of `from_interval` re-measured in intervals of `to_interval` (both > 0),
// rounded down, or up with `up`: integer ns cannot hold every fraction of a token.
std::int64_t rescale(std::int64_t ns, std::int64_t from_interval, std::int64_t to_interval, bool up = false) noexcept {
  if (from_interval == to_interval) return ns;
  const int128 num = static_cast<int128>(ns) * to_interval;
  int128 q = num / from_interval;
  const int128 rem = num % from_interval;
  if (rem != 0 && (rem > 0) == up) q += up ? 1 : -1;  // division truncates towards zero
  return clamp_to_int64(q);
}

}  // namespace

gcra_params token_bucket::block::params() const noexcept {
  return {interval_ns.load(relaxed), burst.load(relaxed), tolerance_ns.load(relaxed)};
}

void token_bucket::block::set(const gcra_params& p, sluice::rate r) noexcept {
  interval_ns.store(p.interval_ns, relaxed);
  burst.store(p.burst, relaxed);
  tolerance_ns.store(p.tolerance_ns, relaxed);
  rate.store(r.per_second, relaxed);
}

result<token_bucket> token_bucket::create(const options& o) {
  if (auto v = validate(token_bucket_policy(o.rate, o.burst)); !v) return v.error();
  if (o.clock == nullptr) return {errc::invalid_argument, "clock must not be null"};
  return token_bucket(o);
}

token_bucket::token_bucket(const options& o) : clock_(o.clock) {
  blocks_[0].set(make_gcra_params(o.rate, o.burst), o.rate);
  blocks_[0].held.store(static_cast<double>(o.burst), relaxed);
}

token_bucket::token_bucket(token_bucket&& other) noexcept : current_(other.current_.load()), clock_(other.clock_) {
  for (std::uint32_t i = 0; i < block_count; ++i) {
    block& to = blocks_[i];
    const block& from = other.blocks_[i];
    to.word.store(from.word.load());
    to.last.store(from.last.load());
    to.set(from.params(), {from.rate.load()});
    to.epoch.store(from.epoch.load());
    to.changed_at.store(from.changed_at.load());
    to.held.store(from.held.load());
    to.written.store(from.written.load());
    to.last_event.store(from.last_event.load());
  }
}

// Loads are acquire: a block's parameters (and the next block's, for a seal) are written before
// the store or CAS that leads to it, which is release.
token_bucket::view token_bucket::load() const noexcept {
  block* b = &blocks_[current_.load(std::memory_order_acquire)];
  for (;;) {
    const std::int64_t word = b->word.load(std::memory_order_acquire);
    if (!is_sealed(word)) return {b, word};
    b = &blocks_[word - sealed_base];
  }
}

// Read after load(): see last_.
std::int64_t token_bucket::evaluation_time(const block& b, time_point now) noexcept {
  return std::max({to_ns(now), earliest, b.last.load(relaxed)});
}

// Every write leaves TAT >= t (a bucket full at t has TAT = t), so an operation evaluated at a
// time earlier than a write's computes the same new TAT from it and only decides more strictly.
void token_bucket::record_write(block& b, std::int64_t t) noexcept {
  if (t > b.last.load(relaxed)) b.last.store(t, relaxed);
}

sluice::rate token_bucket::rate() const noexcept { return {load().b->rate.load(relaxed)}; }

std::int64_t token_bucket::burst() const noexcept { return load().b->burst.load(relaxed); }

// Every update below is a compare-and-swap loop on the current block's word (acq_rel).

result<decision> token_bucket::try_acquire(time_point now, std::int64_t cost) noexcept {
  view v = load();
  for (;;) {
    const gcra_params p = v.b->params();
    if (auto c = check_cost(p, cost); !c) return c.error();
    const std::int64_t t = evaluation_time(*v.b, now);
    const gcra_state s{v.word};
    const decision d = s.evaluate(p, t, cost);
    if (!d.allowed || p.interval_ns == 0) {
      // Nothing to write; the answer stands if the word (hence its parameters) did not move.
      if (v.b->word.load(std::memory_order_acquire) == v.word) return d;
      v = load();
      continue;
    }
    record_write(*v.b, t);
    mark_written(*v.b);
    if (v.b->word.compare_exchange_weak(v.word, gcra_state::next_tat(s.tat, p, t, cost), std::memory_order_acq_rel,
                                        std::memory_order_acquire)) {
      return d;
    }
    if (is_sealed(v.word)) v = load();
  }
}

result<reservation> token_bucket::reserve_until(time_point now, std::int64_t cost, time_point latest) noexcept {
  view v = load();
  for (;;) {
    const gcra_params p = v.b->params();
    if (auto c = check_cost(p, cost); !c) return c.error();
    const std::int64_t t = evaluation_time(*v.b, now);
    if (p.interval_ns == 0) return reservation{.tokens = cost, .time_to_act = from_ns(t), .interval_ns = 0};
    if (p.burst == 0) return {errc::cost_exceeds_burst, "burst is 0: tokens can never be reserved"};
    const std::int64_t tat_after = gcra_state::next_tat(v.word, p, t, cost);
    const std::int64_t act = std::max(t, saturating::sub(tat_after, p.tolerance_ns));
    if (act > to_ns(latest)) {
      return {errc::deadline_exceeded,
              "tokens would be available only " + std::to_string(act - t) + " ns from now, after the deadline"};
    }
    const std::uint64_t epoch = v.b->epoch.load(relaxed);
    record_write(*v.b, t);
    mark_written(*v.b);
    if (v.b->word.compare_exchange_weak(v.word, tat_after, std::memory_order_acq_rel, std::memory_order_acquire)) {
      return reservation{.tokens = cost, .time_to_act = from_ns(act), .interval_ns = p.interval_ns, .epoch = epoch};
    }
    if (is_sealed(v.word)) v = load();
  }
}

result<reservation> token_bucket::reserve(time_point now, std::int64_t cost) noexcept {
  return reserve_until(now, cost, time_point::max());
}

// The tokens a cancel at t gives back, in ns of interval `p`: the reservation's tokens less those
// reserved after it (from its moment to x/time/rate's lastEvent), counted at the reservation's rate.
std::int64_t restored_ns(const reservation& r, const gcra_params& p, std::int64_t last_event) noexcept {
  const std::int64_t later_ns = std::max<std::int64_t>(0, saturating::sub(last_event, to_ns(r.time_to_act)));
  return saturating::sub(saturating::mul(r.tokens, p.interval_ns),
                         rescale(later_ns, r.interval_ns, p.interval_ns, true));
}

// The word after giving back `restore` ns at t: a bucket refilled past full is full (TAT = t).
std::int64_t refilled(std::int64_t word, std::int64_t t, std::int64_t restore) noexcept {
  return std::max(saturating::sub(std::max(word, t), restore), t);
}

void token_bucket::cancel(const reservation& r, time_point now) noexcept {
  if (r.tokens <= 0 || r.interval_ns <= 0) return;  // an infinite rate took nothing
  view v = load();
  for (;;) {
    if (v.b->epoch.load(relaxed) != r.epoch) return cancel_across_change(r, now);
    const gcra_params p = v.b->params();
    if (p.interval_ns == 0) return;
    const std::int64_t t = evaluation_time(*v.b, now);
    if (to_ns(r.time_to_act) < t) return;  // its moment has passed
    // Reserved under these parameters, so this block has written: lastEvent is word - tolerance.
    const std::int64_t restore = restored_ns(r, p, saturating::sub(v.word, p.tolerance_ns));
    if (restore <= 0) return;
    record_write(*v.b, t);
    if (v.b->word.compare_exchange_weak(v.word, refilled(v.word, t, restore), std::memory_order_acq_rel,
                                        std::memory_order_acquire)) {
      return;
    }
    if (is_sealed(v.word)) v = load();
  }
}

// Rare (a change came between reserve and cancel), so it takes the change mutex: no change can then
// seal the current block, and the lastEvent carried over from before the change may be updated
// with the word, as x/time/rate's CancelAt does.
void token_bucket::cancel_across_change(const reservation& r, time_point now) noexcept {
  std::lock_guard lock(change_mutex_);
  block& b = blocks_[current_.load(relaxed)];
  const gcra_params p = b.params();
  if (p.interval_ns == 0) return;
  std::int64_t word = b.word.load(std::memory_order_acquire);
  for (;;) {
    const std::int64_t t = evaluation_time(b, now);
    if (to_ns(r.time_to_act) < t) return;
    const bool written = b.written.load(relaxed);
    const std::int64_t last_event = written ? saturating::sub(word, p.tolerance_ns) : b.last_event.load(relaxed);
    const std::int64_t restore = restored_ns(r, p, last_event);
    if (restore <= 0) return;
    record_write(b, t);
    if (b.word.compare_exchange_weak(word, refilled(word, t, restore), std::memory_order_acq_rel,
                                     std::memory_order_acquire)) {
      // lastEvent moves back by what was given back, as word - tolerance does once written (for
      // the latest reservation that is x/time/rate's own rule: the one before it is the latest).
      if (!written)
        b.last_event.store(saturating::sub(last_event, rescale(restore, p.interval_ns, r.interval_ns)), relaxed);
      return;
    }
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
  const view v = load();
  const gcra_params p = v.b->params();
  const std::int64_t t = evaluation_time(*v.b, now);
  if (p.interval_ns == 0) {
    // As x/time/rate: an infinite rate refills at once, but not in no time at all.
    if (t != v.b->changed_at.load(relaxed)) return p.burst;
    return static_cast<std::int64_t>(std::floor(std::min(v.b->held.load(relaxed), static_cast<double>(p.burst))));
  }
  const std::int64_t debt = std::max<std::int64_t>(0, saturating::sub(v.word, t));
  return saturating::floor_div(saturating::sub(p.tolerance_ns, debt), p.interval_ns);
}

result<void> token_bucket::change(std::optional<sluice::rate> new_rate, std::optional<std::int64_t> new_burst,
                                  time_point now) {
  std::lock_guard lock(change_mutex_);
  const sluice::rate r = new_rate.value_or(rate());
  const std::int64_t burst = new_burst.value_or(this->burst());
  if (auto v = validate(token_bucket_policy(r, burst)); !v) return v;
  const gcra_params np = make_gcra_params(r, burst);
  // Only changes seal, and they hold the mutex: the current block's word is never sealed here.
  const std::uint32_t from = current_.load(relaxed);
  const std::uint32_t to = (from + 1) % block_count;
  block& ob = blocks_[from];
  block& nb = blocks_[to];
  const gcra_params op = ob.params();
  nb.set(np, r);
  std::int64_t word = ob.word.load(std::memory_order_acquire);
  for (;;) {
    const std::int64_t t = evaluation_time(ob, now);
    // What the bucket holds at t, and x/time/rate's lastEvent (see cancel), carried over.
    double held = static_cast<double>(op.burst);
    std::int64_t last_event = ob.last_event.load(relaxed);
    std::int64_t debt = 0;  // ns below full at t, in the old interval
    if (op.interval_ns != 0) {
      debt = std::max<std::int64_t>(0, saturating::sub(word, t));
      held = static_cast<double>(saturating::sub(op.tolerance_ns, debt)) / static_cast<double>(op.interval_ns);
      if (ob.written.load(relaxed)) last_event = saturating::sub(word, op.tolerance_ns);
    } else if (t == ob.changed_at.load(relaxed)) {
      held = std::min(ob.held.load(relaxed), held);  // an infinite rate refills nothing in no time
    }
    // Keep the tokens held: the new word is t plus the new bucket's shortfall (a full or over-full
    // bucket is full, TAT = t). Exact when only the burst changes or the old rate was finite.
    std::int64_t tat = t;
    if (np.interval_ns != 0) {
      std::int64_t shortfall_ns;
      if (op.interval_ns != 0) {
        // (new burst - held) × new interval = new tolerance - (old tolerance - debt) rescaled; the
        // tokens held are rounded down to whole ns of the new interval.
        shortfall_ns = saturating::sub(np.tolerance_ns,
                                       rescale(saturating::sub(op.tolerance_ns, debt), op.interval_ns, np.interval_ns));
      } else {
        const double ns = (static_cast<double>(np.burst) - held) * static_cast<double>(np.interval_ns);
        shortfall_ns = static_cast<std::int64_t>(std::ceil(std::min(ns, 2.0 * gcra_max_tolerance_ns)));
      }
      if (shortfall_ns > 0) tat = saturating::add(t, shortfall_ns);
    }
    nb.word.store(tat, relaxed);
    nb.epoch.store(ob.epoch.load(relaxed) + 1, relaxed);
    nb.changed_at.store(t, relaxed);
    nb.held.store(held, relaxed);
    nb.written.store(false, relaxed);
    nb.last_event.store(last_event, relaxed);
    nb.last.store(t, relaxed);
    // The seal publishes the new block (release) and makes every CAS on the old word fail.
    if (ob.word.compare_exchange_weak(word, sealed_base + to, std::memory_order_acq_rel, std::memory_order_acquire)) {
      break;
    }
  }
  current_.store(to, std::memory_order_release);
  return {};
}

result<void> token_bucket::set_rate(sluice::rate r, time_point now) { return change(r, std::nullopt, now); }

result<void> token_bucket::set_burst(std::int64_t b, time_point now) { return change(std::nullopt, b, now); }

}  // namespace sluice
