// SPDX-License-Identifier: Apache-2.0
#include "redis/lease_table.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "sluice/gcra.hpp"

namespace sluice::detail {
namespace {

constexpr std::int64_t forever = std::numeric_limits<std::int64_t>::max();

std::int64_t add_sat(std::int64_t a, std::int64_t b) {
  if (b > 0 && a > forever - b) return forever;
  return a + b;
}

std::int64_t ns_of(nanoseconds d) { return d == never ? forever : d.count(); }

std::int64_t interval_of(const policy& p) {
  if (p.algorithm != algorithm::token_bucket) return 0;
  return make_gcra_params(p.rate, p.burst).interval_ns;
}

}  // namespace

lease_table::lease_table(const rule& r, prepared_script script, std::size_t max_keys,
                         std::shared_ptr<lease_counters> counters)
    : rule_(r),
      script_(std::move(script)),
      capacity_(r.leased_layer().capacity()),
      period_ns_(r.lease->period.count()),
      interval_ns_(interval_of(r.leased_layer())),
      max_units_(std::max<std::int64_t>(
          1, static_cast<std::int64_t>(std::floor(r.lease->max_share * static_cast<double>(capacity_))))),
      // A token bucket's lease holds the slots up to one period ahead, and never more than
      // max_units of them: a share of the bucket, like any lease.
      hold_ns_(interval_ns_ > 0
                   ? std::min(period_ns_, max_units_ > forever / interval_ns_ ? forever : max_units_ * interval_ns_)
                   : 0),
      max_keys_per_shard_(std::max<std::size_t>(1, max_keys / shard_count)),
      counters_(std::move(counters)) {
  user_layer_.script = script_.user_script;
  user_layer_.limit = script_.limit;
}

lease_table::shard& lease_table::shard_of(std::string_view key) { return shards_[shard_hash_(key) % shard_count]; }

std::int64_t lease_table::available(segment& s, std::int64_t now) const {
  if (now >= s.valid_until) return 0;
  if (interval_ns_ > 0 && now >= s.first_end) {
    // Slots that ended by now can no longer be used: their units are passed, not used.
    s.next = std::max(s.next, (now - s.first_end) / interval_ns_ + 1);
  }
  return std::max<std::int64_t>(0, s.units - s.next);
}

std::int64_t lease_table::available(entry& e, std::int64_t now) const {
  std::int64_t n = 0;
  for (segment& s : e.segments) n += available(s, now);
  return n;
}

void lease_table::leftovers(const std::string& key, entry& e, std::int64_t now, bool all,
                            std::vector<give_back>& out) const {
  // A key no longer checked here for a period gives its leases back: another instance may need
  // them. While it is busy they stay, to be used (or to end with their window or slots).
  const bool idle = all || now - e.last_seen >= period_ns_;
  // The newest first: a token bucket's older lease is the last slots again once the newer one's
  // are back.
  for (auto s = e.segments.rbegin(); s != e.segments.rend(); ++s) {
    const std::int64_t left = available(*s, now);
    if (!idle && left > 0) continue;  // still in use
    if (left > 0) out.push_back({key, s->token, left});
    s->units = 0;  // erased below: used up, ended, or given back
  }
  std::erase_if(e.segments, [](const segment& s) { return s.units == 0; });
}

decision lease_table::leased_decision(const entry& e, bool allowed, std::int64_t now) const {
  decision d;
  d.allowed = allowed;
  d.limit = capacity_;
  d.remaining = e.shared_remaining;
  d.reset_after = e.reset_at == forever ? never : nanoseconds(std::max<std::int64_t>(0, e.reset_at - now));
  if (!allowed) {
    d.retry_after = e.refused_until == forever ? never : nanoseconds(std::max<std::int64_t>(1, e.refused_until - now));
  }
  return d;
}

// At least the cost, at most max_units: for a key checked in the last period too, the units this
// instance checks in about two periods (a lease stays while its key is busy); for a new key, the
// units checked so far, so that a key checked once leases its cost alone (an exact check) and a
// busy one's leases double until they match its demand.
// A window's lease is also no larger than that demand until the window ends: what is left then is
// lost to every instance.
std::int64_t lease_table::wanted(const entry& e, std::int64_t cost, std::int64_t now) const {
  std::int64_t demand = e.last_demand > 0 ? add_sat(std::max(e.demand, e.last_demand), e.last_demand) : e.demand;
  if (now < e.window_end && e.last_demand > 0) {
    const double until_end = static_cast<double>(e.window_end - now) / static_cast<double>(period_ns_);
    const double expected = std::ceil(until_end * static_cast<double>(e.last_demand));
    if (expected < static_cast<double>(demand)) demand = static_cast<std::int64_t>(expected);
  }
  return std::max(cost, std::min(max_units_, demand));
}

lease_plan lease_table::check(std::string_view key, std::int64_t cost, std::int64_t now,
                              const std::function<lease_waiter()>& make_waiter, bool resumed) {
  shard& sh = shard_of(key);
  std::lock_guard lock(sh.mutex);
  auto it = sh.entries.find(key);
  if (it == sh.entries.end()) {
    if (sh.entries.size() >= max_keys_per_shard_) return {};
    it = sh.entries.emplace(std::string(key), entry{}).first;
    it->second.period_start = now;
  }
  entry& e = it->second;
  e.last_seen = now;
  if (now - e.period_start >= period_ns_) {
    e.last_demand = now - e.period_start >= 2 * period_ns_ ? 0 : e.demand;
    e.demand = 0;
    e.period_start = now;
  }
  if (!resumed) e.demand = add_sat(e.demand, cost);

  lease_plan plan;
  std::int64_t have = available(e, now);
  if (have >= cost) {
    plan.what = lease_plan::step::admit;
    std::int64_t need = cost;
    for (segment& s : e.segments) {
      const std::int64_t take = std::min(need, available(s, now));
      if (take == 0) continue;
      s.next += take;
      need -= take;
      if (plan.reservation.count < static_cast<int>(plan.reservation.parts.size())) {
        plan.reservation.parts[plan.reservation.count++] = {s.id, take, s.next};
      }
      if (need == 0) break;
    }
    have -= cost;
    plan.leased = leased_decision(e, true, now);
    plan.leased.remaining = std::min(capacity_, add_sat(e.shared_remaining, have));
    const std::int64_t want = wanted(e, 0, now);
    if (!e.taking && want >= 2 && have < want / 2 && have < max_units_ && now >= e.refill_refused_until) {
      // Refill before the lease runs dry, so that a busy key does not wait for Redis.
      plan.refill = std::min(want, max_units_ - have);
      e.taking = true;
    }
    counters_->local_admits.fetch_add(1, std::memory_order_relaxed);
    return plan;
  }
  if (e.taking) {
    // A check that waited once asks by itself rather than wait for one call after another.
    if (resumed || e.waiting.size() >= max_waiting) return {};
    e.waiting.push_back(make_waiter());
    plan.what = lease_plan::step::wait;
    return plan;
  }
  if (now < e.refused_until && cost >= e.refused_cost) {
    plan.what = lease_plan::step::refuse;
    plan.leased = leased_decision(e, false, now);
    counters_->local_refusals.fetch_add(1, std::memory_order_relaxed);
    return plan;
  }
  e.taking = true;
  plan.what = lease_plan::step::take;
  plan.want = wanted(e, cost, now);
  return plan;
}

std::vector<lease_waiter> lease_table::answered(std::string_view key, const lease_grant& g, std::int64_t now) {
  shard& sh = shard_of(key);
  std::lock_guard lock(sh.mutex);
  auto it = sh.entries.find(key);
  if (it == sh.entries.end()) return {};
  entry& e = it->second;
  e.taking = false;
  const lease_reply& r = g.reply;
  e.reset_at = add_sat(g.sent_ns, ns_of(r.leased.reset_after));
  if (!r.leased.allowed) {
    e.shared_remaining = r.leased.remaining;
    const std::int64_t until = add_sat(g.sent_ns, ns_of(r.leased.retry_after));
    if (g.used == 0) {
      // A refill refused: no more refills until then, but checks still ask (units given back by
      // other instances may be there before).
      e.refill_refused_until = until;
    } else {
      e.refused_until = until;
      e.refused_cost = g.used;
    }
    return std::move(e.waiting);
  }
  e.refused_until = 0;
  const std::int64_t units = std::min(r.units, forever / 4);
  e.shared_remaining = std::max<std::int64_t>(0, r.leased.remaining - std::max<std::int64_t>(0, units - g.used));
  if (units > 0) {
    counters_->leases.fetch_add(1, std::memory_order_relaxed);
    counters_->units_leased.fetch_add(static_cast<std::uint64_t>(units), std::memory_order_relaxed);
  }
  std::erase_if(e.segments, [&](segment& s) { return available(s, now) == 0; });
  if (units > g.used) {
    segment s;
    s.id = next_segment_.fetch_add(1, std::memory_order_relaxed);
    s.units = units;
    s.next = g.used;
    s.token = r.token;
    // From the call's time rounded down to a µs (the scripts' `now` is in whole µs), earlier than
    // Redis ran it, and 0.1% shorter: Redis measured how long the units count on its clock, this
    // instance spends it on its own, and clocks disciplined by NTP run within 0.05% of each other.
    // The window's or the last slot's end is then no later here than on Redis.
    const std::int64_t origin = g.sent_ns - g.sent_ns % 1000;
    // (A negative time, which no script replies, has passed already.)
    std::int64_t valid = std::clamp<std::int64_t>(r.valid_us, 0, forever / 2000) * 1000;
    valid -= valid / 1000;
    if (interval_ns_ > 0) {
      s.valid_until = add_sat(origin, valid);
      s.first_end = s.valid_until - (units - 1) * std::min(interval_ns_, forever / units);
    } else if (rule_.leased_layer().algorithm == algorithm::token_bucket) {
      s.valid_until = forever;  // an infinite rate: any unit, any time
      s.first_end = forever;
    } else {
      s.valid_until = add_sat(origin, valid);
      e.window_end = s.valid_until;
    }
    if (s.valid_until > now) e.segments.push_back(std::move(s));
  }
  return std::move(e.waiting);
}

std::vector<lease_waiter> lease_table::failed(std::string_view key) {
  shard& sh = shard_of(key);
  std::lock_guard lock(sh.mutex);
  auto it = sh.entries.find(key);
  if (it == sh.entries.end()) return {};
  it->second.taking = false;
  return std::move(it->second.waiting);
}

void lease_table::undo(std::string_view key, const lease_reservation& r, std::int64_t now) {
  shard& sh = shard_of(key);
  std::lock_guard lock(sh.mutex);
  auto it = sh.entries.find(key);
  if (it == sh.entries.end()) return;
  for (int i = 0; i < r.count; ++i) {
    const lease_reservation::part& p = r.parts[i];
    for (segment& s : it->second.segments) {
      if (s.id != p.segment || now >= s.valid_until) continue;
      // A window's units are alike; a token bucket's are its slots, put back only while they are
      // the next to use (nobody took a later one since).
      if (interval_ns_ == 0 || s.next == p.next_after) s.next = std::max<std::int64_t>(0, s.next - p.units);
    }
  }
}

std::vector<give_back> lease_table::expire(std::int64_t now) {
  std::vector<give_back> out;
  for (shard& sh : shards_) {
    std::lock_guard lock(sh.mutex);
    for (auto it = sh.entries.begin(); it != sh.entries.end();) {
      entry& e = it->second;
      leftovers(it->first, e, now, false, out);
      // A refusal for ever (a bucket of burst 0) is not kept: the key asks again once, if it returns.
      const bool idle = e.segments.empty() && !e.taking && e.waiting.empty() &&
                        (now >= e.refused_until || e.refused_until == forever) && now - e.last_seen >= 2 * period_ns_;
      it = idle ? sh.entries.erase(it) : std::next(it);
    }
  }
  return out;
}

void lease_table::forget(std::string_view key) {
  shard& sh = shard_of(key);
  std::lock_guard lock(sh.mutex);
  auto it = sh.entries.find(key);
  if (it == sh.entries.end()) return;
  if (!it->second.taking && it->second.waiting.empty()) {
    sh.entries.erase(it);
    return;
  }
  entry& e = it->second;
  e.segments.clear();
  e.refused_until = e.refused_cost = e.refill_refused_until = 0;
}

std::vector<give_back> lease_table::drain(std::int64_t now) {
  dropped_.store(true, std::memory_order_relaxed);
  std::vector<give_back> out;
  for (shard& sh : shards_) {
    std::lock_guard lock(sh.mutex);
    for (auto& [key, e] : sh.entries) leftovers(key, e, now, true, out);
    std::erase_if(sh.entries, [](const auto& kv) { return !kv.second.taking && kv.second.waiting.empty(); });
  }
  return out;
}

}  // namespace sluice::detail
