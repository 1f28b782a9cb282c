// SPDX-License-Identifier: Apache-2.0
#include "sluice/keyed.hpp"

#include <algorithm>
#include <cassert>
#include <mutex>
#include <string>
#include <variant>
#include <vector>

#include "core/composite_key.hpp"
#include "keyed/keyed_table.hpp"
#include "sluice/limiter_state.hpp"

namespace sluice {

// Token buckets get a table of bare 8-byte states; the window algorithms share one of limiter_state.
using bucket_table = detail::keyed_table<gcra_state, gcra_params>;
using window_table = detail::keyed_table<limiter_state, compiled_policy>;

using any_table = std::variant<bucket_table, window_table>;

struct keyed_limiter::impl {
  sluice::policy policy;
  sluice::clock* clock;
  // Shared with the limiters retuned from this one (retuned()): one set of keys, one state each.
  std::shared_ptr<any_table> table;
};

namespace {

// The parameters a check uses: an override's, or the table's.
template <class Params>
const Params& params_of(const Params& table_params, const keyed_limiter::key_limits* limits) {
  if (limits == nullptr) return table_params;
  if constexpr (std::is_same_v<Params, gcra_params>) {
    return limits->compiled.gcra;
  } else {
    return limits->compiled;
  }
}

bool same_shape(const policy& a, const policy& b) {
  return a.algorithm == b.algorithm && (a.algorithm == algorithm::token_bucket || (a.window == b.window && a.calendar == b.calendar));
}

}  // namespace

result<keyed_limiter::key_limits> keyed_limiter::limits_for(const sluice::policy& p) const {
  if (auto v = validate(p); !v) return v.error();
  if (!same_shape(p, impl_->policy))
    return {errc::invalid_argument, "key limits keep the limiter's algorithm and window"};
  return key_limits{p, compiled_policy::from(p)};
}

result<std::unique_ptr<keyed_limiter>> keyed_limiter::create(const options& o) {
  if (auto v = validate(o.policy); !v) return v.error();
  if (o.max_keys == 0) return {errc::invalid_argument, "max_keys must be >= 1"};
  if (o.clock == nullptr) return {errc::invalid_argument, "clock must not be null"};
  const compiled_policy cp = compiled_policy::from(o.policy);
  auto make_table = [&]() -> std::shared_ptr<any_table> {
    if (o.policy.algorithm == algorithm::token_bucket) {
      return std::make_shared<any_table>(std::in_place_type<bucket_table>, cp.gcra, o.max_keys, gcra_state{},
                                         o.when_full);
    }
    return std::make_shared<any_table>(std::in_place_type<window_table>, cp, o.max_keys, limiter_state::make(cp),
                                       o.when_full);
  };
  auto p = std::unique_ptr<impl>(new impl{o.policy, o.clock, make_table()});
  return std::unique_ptr<keyed_limiter>(new keyed_limiter(std::move(p)));
}

result<std::unique_ptr<keyed_limiter>> keyed_limiter::retuned(keyed_limiter& from, const sluice::policy& p,
                                                              time_point now) {
  if (auto v = validate(p); !v) return v.error();
  if (!same_shape(p, from.impl_->policy))
    return {errc::invalid_argument, "a retuned limiter keeps its algorithm and window"};
  const compiled_policy cp = compiled_policy::from(p);
  const std::int64_t now_ns = to_ns(now);
  std::visit(
      [&](auto& table) {
        using table_type = std::decay_t<decltype(table)>;
        if constexpr (std::is_same_v<table_type, bucket_table>) {
          table.retune(cp.gcra,
                       [&](gcra_state& s, const gcra_params& a, const gcra_params& b) { s.retune(a, b, now_ns); });
        } else {
          table.retune(cp, [&](limiter_state& s, const compiled_policy& a, const compiled_policy& b) {
            s.retune(a, b, now_ns);
          });
        }
      },
      *from.impl_->table);
  auto q = std::unique_ptr<impl>(new impl{p, from.impl_->clock, from.impl_->table});
  return std::unique_ptr<keyed_limiter>(new keyed_limiter(std::move(q)));
}

keyed_limiter::keyed_limiter(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
keyed_limiter::~keyed_limiter() = default;

result<decision> keyed_limiter::try_acquire(std::string_view key, time_point now, std::int64_t cost,
                                            const key_limits* limits) {
  if (key.empty()) return {errc::invalid_argument, "key must not be empty"};
  if (auto v = validate_key(key); !v) return v.error();
  if (auto c = validate_cost(limits ? limits->policy : impl_->policy, cost); !c) return c.error();
  return acquire(key, now, cost, limits);
}

result<decision> keyed_limiter::acquire(std::string_view key, time_point now, std::int64_t cost,
                                        const key_limits* limits) {
  assert(!key.empty() && key.size() <= max_key_length && cost >= 0);
  const std::int64_t now_ns = to_ns(now);
  return std::visit(
      [&](auto& table) {
        return table.with_entry(key, now_ns, [&](auto& state, const auto& params) {
          return check_and_commit(state, params_of(params, limits), now_ns, cost);
        });
      },
      *impl_->table);
}

result<decision> keyed_limiter::try_acquire(std::string_view key, std::int64_t cost) {
  return try_acquire(key, impl_->clock->now(), cost);
}

result<decision> keyed_limiter::try_acquire_dual(keyed_limiter& tenants, std::string_view tenant, keyed_limiter& users,
                                                 std::string_view user, time_point now, std::int64_t cost,
                                                 const key_limits* tenant_limits, const key_limits* user_limits) {
  if (&tenants == &users) return {errc::invalid_argument, "tenant and user layers must be different limiters"};
  if (tenant.empty()) return {errc::invalid_argument, "tenant must not be empty"};
  if (user.empty()) return {errc::invalid_argument, "user must not be empty"};
  if (auto v = validate_key(tenant, "tenant"); !v) return v.error();
  if (auto v = validate_key(user, "user"); !v) return v.error();
  const sluice::policy& tenant_policy = tenant_limits ? tenant_limits->policy : tenants.impl_->policy;
  const sluice::policy& user_policy = user_limits ? user_limits->policy : users.impl_->policy;
  if (auto c = validate_cost(tenant_policy, cost); !c)
    return error(c.error().code, "tenant layer: " + c.error().message);
  if (auto c = validate_cost(user_policy, cost); !c) return error(c.error().code, "user layer: " + c.error().message);
  return acquire_dual(tenants, tenant, users, user, now, cost, tenant_limits, user_limits);
}

result<decision> keyed_limiter::acquire_dual(keyed_limiter& tenants, std::string_view tenant, keyed_limiter& users,
                                             std::string_view user, time_point now, std::int64_t cost,
                                             const key_limits* tenant_limits, const key_limits* user_limits) {
  assert(&tenants != &users && !tenant.empty() && !user.empty() && cost >= 0);
  const std::int64_t now_ns = to_ns(now);
  const std::string user_key = detail::pair_key(tenant, user);
  return std::visit(
      [&](auto& tenant_table, auto& user_table) {
        // Tenant first, then user: the one lock order every dual-layer check uses.
        return with_entry_pair(
            tenant_table, tenant, user_table, user_key, now_ns, [&](auto& t, const auto& tp, auto& u, const auto& up) {
              return check_dual_layer(t, params_of(tp, tenant_limits), u, params_of(up, user_limits), now_ns, cost);
            });
      },
      *tenants.impl_->table, *users.impl_->table);
}

result<void> keyed_limiter::try_acquire_all(std::span<const keyed_check> checks, time_point now,
                                            std::span<decision> out) {
  if (out.size() != checks.size()) return {errc::invalid_argument, "one decision per check"};
  for (const keyed_check& c : checks) {
    if (c.key.empty()) return {errc::invalid_argument, "key must not be empty"};
    if (auto v = validate_key(c.key); !v) return v.error();
    if (c.cost <= 0) return {errc::invalid_argument, "cost must be > 0, got " + std::to_string(c.cost)};
  }
  return acquire_all(checks, now, out);
}

result<void> keyed_limiter::acquire_all(std::span<const keyed_check> checks, time_point now, std::span<decision> out) {
  assert(out.size() == checks.size());
  const std::int64_t now_ns = to_ns(now);
  std::vector<std::variant<bucket_table::place, window_table::place>> places(checks.size());
  std::vector<std::mutex*> locks;
  locks.reserve(checks.size());
  for (std::size_t i = 0; i < checks.size(); ++i) {
    std::visit(
        [&](auto& table) {
          auto p = table.locate(checks[i].key);
          locks.push_back(&p.mutex());
          places[i] = p;
        },
        *checks[i].limiter->impl_->table);
  }
  // One lock order for every caller: no deadlock between calls sharing shards.
  std::sort(locks.begin(), locks.end(), std::less<>());
  locks.erase(std::unique(locks.begin(), locks.end()), locks.end());
  for (std::mutex* m : locks) m->lock();
  struct unlock_all {
    std::vector<std::mutex*>& held;
    ~unlock_all() {
      for (auto it = held.rbegin(); it != held.rend(); ++it) (*it)->unlock();
    }
  } unlock{locks};

  // Calls fn(table, place) for check i, with the types of its table.
  auto on_entry = [&](std::size_t i, auto&& fn) {
    return std::visit(
        [&](auto& table) {
          using table_type = std::decay_t<decltype(table)>;
          return fn(table, std::get<typename table_type::place>(places[i]));
        },
        *checks[i].limiter->impl_->table);
  };

  // Every shard first makes room for the call's keys, so that making one rebuilds nothing (a
  // rebuild drops idle entries, a fresh one among them); then every entry is made, then found again
  // without making any. Only at the key cap, where making one evicts another, can the call's new
  // keys take each other's place: it is then refused, recording nothing.
  struct shard_use {
    const void* shard;
    std::size_t first;  // a check whose key lives there
    std::size_t keys;
  };
  std::vector<shard_use> shards;
  for (std::size_t i = 0; i < checks.size(); ++i) {
    const void* shard = std::visit([](const auto& pl) -> const void* { return pl.where_id(); }, places[i]);
    auto it = std::find_if(shards.begin(), shards.end(), [&](const shard_use& u) { return u.shard == shard; });
    if (it == shards.end()) {
      shards.push_back({shard, i, 1});
    } else {
      ++it->keys;
    }
  }
  for (const shard_use& u : shards) {
    on_entry(u.first, [&](auto& table, const auto& pl) { table.reserve_at(pl, u.keys, now_ns); });
  }
  for (std::size_t i = 0; i < checks.size(); ++i) {
    const bool made =
        on_entry(i, [&](auto& table, const auto& pl) { return table.entry_at(pl, checks[i].key, now_ns) != nullptr; });
    if (!made) return bucket_table::full_error();
  }
  std::vector<std::variant<gcra_state*, limiter_state*>> states(checks.size());
  for (std::size_t i = 0; i < checks.size(); ++i) {
    const bool found = on_entry(i, [&](auto& table, const auto& pl) {
      auto* s = table.existing_at(pl, checks[i].key);
      states[i] = s;
      return s != nullptr;
    });
    if (!found)
      return {errc::capacity_exhausted, "at the key cap, the new keys of one call took each other's place: try again"};
  }
  auto state_of = [&](std::size_t i, auto& table) {
    return std::get<typename std::decay_t<decltype(table)>::state_type*>(states[i]);
  };

  // From here nothing is made: the entries found stay where they are.
  bool all_admit = true;
  for (std::size_t i = 0; i < checks.size(); ++i) {
    const keyed_check& c = checks[i];
    const bool never_admitted = exceeds_capacity(c.limits ? c.limits->policy : c.limiter->impl_->policy, c.cost);
    out[i] = on_entry(i, [&](auto& table, const auto& pl) {
      auto* s = state_of(i, table);
      if (!never_admitted) return s->evaluate(params_of(pl.params(), c.limits), now_ns, c.cost);
      // Looked at with the least cost, and refused: no wait admits this one.
      decision looked = s->evaluate(params_of(pl.params(), c.limits), now_ns, 1);
      if (looked.allowed) looked.remaining += 1;
      looked.allowed = false;
      looked.retry_after = never;
      return looked;
    });
    all_admit = all_admit && out[i].allowed;
  }
  for (std::size_t i = 0; i < checks.size(); ++i) {
    if (!all_admit) {
      // It would have admitted, and records nothing: its state is as before the call.
      if (out[i].allowed) out[i].remaining += checks[i].cost;
      continue;
    }
    on_entry(i, [&](auto& table, const auto& pl) {
      state_of(i, table)->commit(params_of(pl.params(), checks[i].limits), now_ns, checks[i].cost);
    });
  }
  return {};
}

bool keyed_limiter::forget(std::string_view key) {
  return std::visit([&](auto& t) { return t.forget(key); }, *impl_->table);
}

bool keyed_limiter::forget_user(std::string_view tenant, std::string_view user) {
  return forget(detail::pair_key(tenant, user));
}

const policy& keyed_limiter::policy() const noexcept { return impl_->policy; }

std::size_t keyed_limiter::size() const {
  return std::visit([](const auto& t) { return t.size(); }, *impl_->table);
}

std::size_t keyed_limiter::memory_bytes() const {
  return std::visit([](const auto& t) { return t.memory_bytes(); }, *impl_->table);
}

void keyed_limiter::sweep(time_point now) {
  std::visit([&](auto& t) { t.sweep(to_ns(now)); }, *impl_->table);
}

key_cap_stats keyed_limiter::stats() const {
  return std::visit([](const auto& t) { return t.stats(); }, *impl_->table);
}

}  // namespace sluice
