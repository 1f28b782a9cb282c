// SPDX-License-Identifier: Apache-2.0
#include "sluice/memory_backend.hpp"

#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "keyed/keyed_unchecked.hpp"
#include "sluice/keyed.hpp"
#include "sluice/prometheus.hpp"

namespace sluice {
namespace {

// The state of one rule: its keyed limiter, and the tenant layer's for dual-layer rules.
struct rule_state {
  rule definition;
  std::unique_ptr<keyed_limiter> limiter;
  std::unique_ptr<keyed_limiter> tenants;
};

// A prepared rule is its state: checks carrying it go straight to its tables. An override's is its
// rule's state with other limits for the keys it concerns (a key's state is the same either way).
struct memory_prepared_rule final : prepared_rule {
  memory_prepared_rule(const rule& r, const backend* owner, std::shared_ptr<rule_state> s)
      : prepared_rule(r, owner), state(std::move(s)) {}
  std::shared_ptr<rule_state> state;
  std::optional<keyed_limiter::key_limits> limits;         // the user layer's, or the only one's
  std::optional<keyed_limiter::key_limits> tenant_limits;  // dual-layer
};

class memory_backend_impl final : public memory_backend {
 public:
  explicit memory_backend_impl(const memory_backend_options& o) : options_(o) {}

  result<prepared_rule_ptr> prepare(const rule& r) override {
    auto s = make_state(r);
    if (!s) return s.error();
    {
      std::lock_guard lock(mutex_);
      remember_prepared(*s);
    }
    return prepared_rule_ptr(std::make_shared<memory_prepared_rule>(r, this, std::move(*s)));
  }

  result<prepared_rule_ptr> prepare_change(const rule& r, const prepared_rule& previous) override {
    if (previous.owner() != this || !same_shape(previous.definition(), r)) return prepare(r);
    if (auto v = validate(r); !v) return v.error();
    const auto& before = *static_cast<const memory_prepared_rule&>(previous).state;
    const time_point now = options_.clock->now();
    auto s = std::make_shared<rule_state>();
    s->definition = r;
    auto limiter = keyed_limiter::retuned(*before.limiter, r.limit, now);
    if (!limiter) return limiter.error();
    s->limiter = std::move(*limiter);
    if (r.tenant) {
      auto tenants = keyed_limiter::retuned(*before.tenants, *r.tenant, now);
      if (!tenants) return tenants.error();
      s->tenants = std::move(*tenants);
    }
    {
      std::lock_guard lock(mutex_);
      remember_prepared(s);
    }
    return prepared_rule_ptr(std::make_shared<memory_prepared_rule>(r, this, std::move(s)));
  }

  result<prepared_rule_ptr> prepare_override(const rule& r, const prepared_rule& base) override {
    if (base.owner() != this || !same_shape(base.definition(), r)) return prepare(r);
    if (auto v = validate(r); !v) return v.error();
    const auto& b = static_cast<const memory_prepared_rule&>(base);
    auto p = std::make_shared<memory_prepared_rule>(r, this, b.state);
    auto limits = b.state->limiter->limits_for(r.limit);
    if (!limits) return limits.error();
    p->limits = std::move(*limits);
    if (r.tenant) {
      auto tenant_limits = b.state->tenants->limits_for(*r.tenant);
      if (!tenant_limits) return tenant_limits.error();
      p->tenant_limits = std::move(*tenant_limits);
    }
    return prepared_rule_ptr(std::move(p));
  }

  result<decision> decide(const check_request& req) override {
    const auto& p = prepared_of(req);
    const time_point now = options_.clock->now();
    const rule_state& s = *p.state;
    if (s.tenants) {
      return detail::keyed_unchecked::acquire_dual(*s.tenants, req.tenant, *s.limiter, req.user, now, req.cost,
                                                   p.tenant_limits ? &*p.tenant_limits : nullptr,
                                                   p.limits ? &*p.limits : nullptr);
    }
    return detail::keyed_unchecked::acquire(*s.limiter, req.key, now, req.cost, p.limits ? &*p.limits : nullptr);
  }

  void async_decide(const check_request& req, check_handler handler) override { handler(decide(req)); }

  result<std::vector<decision>> decide_all(std::span<const check_request> checks) override {
    std::vector<keyed_limiter::keyed_check> keyed(checks.size());
    for (std::size_t i = 0; i < checks.size(); ++i) {
      const auto& p = prepared_of(checks[i]);
      keyed[i] = {p.state->limiter.get(), checks[i].key, checks[i].cost, p.limits ? &*p.limits : nullptr};
    }
    std::vector<decision> out(checks.size());
    if (auto r = detail::keyed_unchecked::acquire_all(keyed, options_.clock->now(), out); !r) return r.error();
    return out;
  }

  void async_decide_all(std::span<const check_request> checks, check_all_handler handler) override {
    handler(decide_all(checks));
  }

  result<void> forget(const check_request& req) override {
    const rule_state& s = *prepared_of(req).state;
    if (!s.tenants) {
      s.limiter->forget(req.key);
    } else if (req.user.empty()) {
      s.tenants->forget(req.tenant);
    } else {
      s.limiter->forget_user(req.tenant, req.user);
    }
    return {};
  }

  bool ready() override { return true; }
  bool completes_inline() const noexcept override { return true; }

  void sweep_idle() override {
    const time_point now = options_.clock->now();
    for (const auto& st : live_states()) {
      st->limiter->sweep(now);
      if (st->tenants) st->tenants->sweep(now);
    }
  }

  void append_metrics(std::string& out) override {
    prometheus::family(out, "sluice_live_keys", "gauge", "Keys held by the in-process backend.");
    prometheus::sample(out, "sluice_live_keys", static_cast<std::uint64_t>(key_count()));
    prometheus::family(out, "sluice_evictions_total", "counter",
                       "Keys dropped or refused at the key cap (max_keys_per_rule), by rule and kind: idle (nothing "
                       "forgotten), active (the key started afresh), refused (new key refused).");
    for (const rule_key_stats& r : key_stats()) {
      const std::string prefix = "sluice_evictions_total{rule=\"" + prometheus::escape_label(r.rule) + "\",kind=\"";
      prometheus::sample(out, prefix + "idle\"}", r.counts.evicted_idle);
      prometheus::sample(out, prefix + "active\"}", r.counts.evicted_active);
      prometheus::sample(out, prefix + "refused\"}", r.counts.refused);
    }
  }

  std::vector<rule_key_stats> key_stats() override {
    std::map<std::string, key_cap_stats, std::less<>> by_rule;  // a reload may hold two states of one name
    for (const auto& st : live_states()) {
      key_cap_stats& c = by_rule[st->definition.name];
      for (const keyed_limiter* l : {st->limiter.get(), st->tenants.get()}) {
        if (l == nullptr) continue;
        const key_cap_stats t = l->stats();
        c.evicted_idle += t.evicted_idle;
        c.evicted_active += t.evicted_active;
        c.refused += t.refused;
      }
    }
    std::vector<rule_key_stats> out;
    for (auto& [name, c] : by_rule) out.push_back({name, c});
    return out;
  }

  std::size_t key_count() override {
    std::size_t n = 0;
    for (const auto& s : live_states()) n += s->limiter->size() + (s->tenants ? s->tenants->size() : 0);
    return n;
  }

 private:
  // Under mutex_. Expired entries are dropped each time the list doubles: preparing n rules costs
  // O(n), not O(n^2), and the list stays within twice the states alive.
  void remember_prepared(const std::shared_ptr<rule_state>& s) {
    if (prepared_.size() >= prepared_sweep_at_) {
      std::erase_if(prepared_, [](const std::weak_ptr<rule_state>& w) { return w.expired(); });
      prepared_sweep_at_ = std::max<std::size_t>(16, 2 * prepared_.size());
    }
    prepared_.push_back(s);
  }

  // Every state in use: those of the prepared rules still held.
  std::vector<std::shared_ptr<rule_state>> live_states() {
    std::lock_guard lock(mutex_);
    std::vector<std::shared_ptr<rule_state>> out;
    for (const auto& w : prepared_) {
      if (auto st = w.lock()) out.push_back(std::move(st));
    }
    return out;
  }

  // Precondition (validate): made by this backend.
  static const memory_prepared_rule& prepared_of(const check_request& req) noexcept {
    return static_cast<const memory_prepared_rule&>(*req.rule);
  }

  // Only limits differ: the same algorithm, window, layers and key-cap behaviour, so the keys'
  // state can carry over.
  static bool same_shape(const rule& a, const rule& b) {
    auto same = [](const policy& x, const policy& y) {
      return x.algorithm == y.algorithm && (x.algorithm == algorithm::token_bucket || (x.window == y.window && x.calendar == y.calendar));
    };
    if (a.when_full != b.when_full || a.tenant.has_value() != b.tenant.has_value()) return false;
    return same(a.limit, b.limit) && (!a.tenant || same(*a.tenant, *b.tenant));
  }

  // A rule's keyed tables, empty.
  result<std::shared_ptr<rule_state>> make_state(const rule& r) const {
    if (auto v = validate(r); !v) return v.error();
    auto s = std::make_shared<rule_state>();
    s->definition = r;
    auto make = [&](const policy& p) {
      return keyed_limiter::create(
          {.policy = p, .max_keys = options_.max_keys_per_rule, .clock = options_.clock, .when_full = r.when_full});
    };
    auto limiter = make(r.limit);
    if (!limiter) return limiter.error();
    s->limiter = std::move(*limiter);
    if (r.tenant) {
      auto tenants = make(*r.tenant);
      if (!tenants) return tenants.error();
      s->tenants = std::move(*tenants);
    }
    return s;
  }

  const memory_backend_options options_;
  std::mutex mutex_;
  std::vector<std::weak_ptr<rule_state>> prepared_;  // guarded by mutex_
  std::size_t prepared_sweep_at_ = 16;               // guarded by mutex_
};

}  // namespace

result<std::unique_ptr<memory_backend>> make_memory_backend(const memory_backend_options& options) {
  if (options.clock == nullptr) return error(errc::invalid_argument, "memory backend: clock must not be null");
  if (options.max_keys_per_rule == 0)
    return error(errc::invalid_argument, "memory backend: max_keys_per_rule must be >= 1");
  return std::unique_ptr<memory_backend>(std::make_unique<memory_backend_impl>(options));
}

}  // namespace sluice
