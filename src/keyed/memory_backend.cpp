#include "sluice/memory_backend.hpp"

#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

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

// Each thread remembers the rule states it used last, so that a check takes no lock and writes no
// shared cache line (with two I/O threads, a shared mutex and reference count cost more than the
// check itself). An entry is valid while its backend's generation, bumped by every change to the
// rules map, is unchanged. A state dropped from the map stays alive while a thread's entry holds it:
// until that thread next misses the cache on the same backend (it then drops its stale entries).
struct cached_rule_state {
  std::uint64_t backend_id = 0;  // 0: empty
  std::uint64_t generation = 0;
  std::shared_ptr<rule_state> state;
};
thread_local std::array<cached_rule_state, 8> rule_cache;
thread_local std::size_t rule_cache_next = 0;
std::atomic<std::uint64_t> next_backend_id{1};

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

  result<decision> check(const check_request& req) override {
    if (auto v = validate(req); !v) return v.error();
    if (req.prepared != nullptr && req.prepared->owner() == this) {
      const auto& p = *static_cast<const memory_prepared_rule*>(req.prepared);
      return decide(*p.state, req, p.limits ? &*p.limits : nullptr, p.tenant_limits ? &*p.tenant_limits : nullptr);
    }
    rule_state* cached = cached_state_for(*req.rule);
    std::shared_ptr<rule_state> held;
    if (cached == nullptr) {
      auto state = state_for(*req.rule);
      if (!state) return state.error();
      held = std::move(*state);
      cached = held.get();
    }
    return decide(*cached, req);
  }

  void async_check(const check_request& req, check_handler handler) override { handler(check(req)); }

  result<std::vector<decision>> check_all(std::span<const check_request> checks) override {
    if (auto v = validate_all(checks); !v) return v.error();
    std::vector<keyed_limiter::keyed_check> keyed(checks.size());
    std::vector<std::shared_ptr<rule_state>> held;  // the states of rules checked unprepared
    for (std::size_t i = 0; i < checks.size(); ++i) {
      const check_request& c = checks[i];
      if (c.prepared != nullptr && c.prepared->owner() == this) {
        const auto& p = *static_cast<const memory_prepared_rule*>(c.prepared);
        keyed[i] = {p.state->limiter.get(), c.key, c.cost, p.limits ? &*p.limits : nullptr};
        continue;
      }
      auto state = state_for(*c.rule);
      if (!state) return state.error();
      held.push_back(std::move(*state));
      keyed[i] = {held.back()->limiter.get(), c.key, c.cost, nullptr};
    }
    std::vector<decision> out(checks.size());
    if (auto r = keyed_limiter::try_acquire_all(keyed, options_.clock->now(), out); !r) return r.error();
    return out;
  }

  void async_check_all(std::span<const check_request> checks, check_all_handler handler) override {
    handler(check_all(checks));
  }

  bool ready() override { return true; }
  bool completes_inline() const noexcept override { return true; }

  void forget_rule(std::string_view name) override {
    std::lock_guard lock(mutex_);
    if (auto it = rules_.find(name); it != rules_.end()) {
      rules_.erase(it);
      generation_.fetch_add(1, std::memory_order_release);
    }
  }

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

  // Every state in use: the rules checked unprepared, and those prepared and still held.
  std::vector<std::shared_ptr<rule_state>> live_states() {
    std::lock_guard lock(mutex_);
    std::vector<std::shared_ptr<rule_state>> out;
    for (const auto& [name, st] : rules_) out.push_back(st);
    for (const auto& w : prepared_) {
      if (auto st = w.lock()) out.push_back(std::move(st));
    }
    return out;
  }

  result<decision> decide(rule_state& s, const check_request& req, const keyed_limiter::key_limits* limits = nullptr,
                          const keyed_limiter::key_limits* tenant_limits = nullptr) {
    const time_point now = options_.clock->now();
    if (s.tenants) {
      return keyed_limiter::try_acquire_dual(*s.tenants, req.tenant, *s.limiter, req.user, now, req.cost, tenant_limits,
                                             limits);
    }
    return s.limiter->try_acquire(req.key, now, req.cost, limits);
  }

  // Only limits differ: the same algorithm, window, layers and key-cap behaviour, so the keys'
  // state can carry over.
  static bool same_shape(const rule& a, const rule& b) {
    auto same = [](const policy& x, const policy& y) {
      return x.algorithm == y.algorithm && (x.algorithm == algorithm::token_bucket || x.window == y.window);
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

  rule_state* cached_state_for(const rule& r) const noexcept {
    const std::uint64_t generation = generation_.load(std::memory_order_acquire);
    for (const cached_rule_state& e : rule_cache) {
      if (e.backend_id == id_ && e.generation == generation && e.state->definition == r) return e.state.get();
    }
    return nullptr;
  }

  // Remembers `s` in this thread's cache, dropping this backend's stale entries.
  void remember(const std::shared_ptr<rule_state>& s, std::uint64_t generation) const {
    for (cached_rule_state& e : rule_cache) {
      if (e.backend_id == id_ && e.generation != generation) e = {};
    }
    rule_cache[rule_cache_next++ % rule_cache.size()] = {id_, generation, s};
  }

  // The rule's state, created on first use; a rule whose definition changed starts afresh.
  result<std::shared_ptr<rule_state>> state_for(const rule& r) {
    std::lock_guard lock(mutex_);
    auto it = rules_.find(r.name);
    if (it != rules_.end() && it->second->definition == r) {
      remember(it->second, generation_.load(std::memory_order_relaxed));
      return it->second;
    }
    auto made = make_state(r);
    if (!made) return made.error();
    std::shared_ptr<rule_state> s = std::move(*made);
    rules_.insert_or_assign(r.name, s);
    const std::uint64_t generation = generation_.fetch_add(1, std::memory_order_release) + 1;
    remember(s, generation);
    return s;
  }

  const memory_backend_options options_;
  const std::uint64_t id_ = next_backend_id.fetch_add(1);
  std::atomic<std::uint64_t> generation_{1};  // bumped under mutex_ by every change to rules_
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<rule_state>, std::less<>> rules_;  // guarded by mutex_
  std::vector<std::weak_ptr<rule_state>> prepared_;                        // guarded by mutex_
  std::size_t prepared_sweep_at_ = 16;                                     // guarded by mutex_
};

}  // namespace

result<std::unique_ptr<memory_backend>> make_memory_backend(const memory_backend_options& options) {
  if (options.clock == nullptr) return error(errc::invalid_argument, "memory backend: clock must not be null");
  if (options.max_keys_per_rule == 0)
    return error(errc::invalid_argument, "memory backend: max_keys_per_rule must be >= 1");
  return std::unique_ptr<memory_backend>(std::make_unique<memory_backend_impl>(options));
}

}  // namespace sluice
