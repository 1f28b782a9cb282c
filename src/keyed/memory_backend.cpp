#include "sluice/memory_backend.hpp"

#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "sluice/keyed.hpp"

namespace sluice {
namespace {

// The state of one rule: its keyed limiter, and the tenant layer's for dual-layer rules.
struct rule_state {
  rule definition;
  std::unique_ptr<keyed_limiter> limiter;
  std::unique_ptr<keyed_limiter> tenants;
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

  result<decision> check(const check_request& req) override {
    if (auto v = validate(req); !v) return v.error();
    rule_state* cached = cached_state_for(*req.rule);
    std::shared_ptr<rule_state> held;
    if (cached == nullptr) {
      auto state = state_for(*req.rule);
      if (!state) return state.error();
      held = std::move(*state);
      cached = held.get();
    }
    const time_point now = options_.clock->now();
    rule_state& s = *cached;
    if (s.tenants) return keyed_limiter::try_acquire_dual(*s.tenants, req.tenant, *s.limiter, req.user, now, req.cost);
    return s.limiter->try_acquire(req.key, now, req.cost);
  }

  void async_check(const check_request& req, check_handler handler) override { handler(check(req)); }

  bool ready() override { return true; }

  void forget_rule(std::string_view name) override {
    std::lock_guard lock(mutex_);
    if (auto it = rules_.find(name); it != rules_.end()) {
      rules_.erase(it);
      generation_.fetch_add(1, std::memory_order_release);
    }
  }

  void sweep_idle() override {
    std::vector<std::shared_ptr<rule_state>> states;
    {
      std::lock_guard lock(mutex_);
      for (const auto& [name, st] : rules_) states.push_back(st);
    }
    const time_point now = options_.clock->now();
    for (const auto& st : states) {
      st->limiter->sweep(now);
      if (st->tenants) st->tenants->sweep(now);
    }
  }

  std::vector<rule_key_stats> key_stats() override {
    std::lock_guard lock(mutex_);
    std::vector<rule_key_stats> out;
    for (const auto& [name, st] : rules_) {
      key_cap_stats c = st->limiter->stats();
      if (st->tenants) {
        const key_cap_stats t = st->tenants->stats();
        c.evicted_idle += t.evicted_idle;
        c.evicted_active += t.evicted_active;
        c.refused += t.refused;
      }
      out.push_back({name, c});
    }
    return out;
  }

  std::size_t key_count() override {
    std::lock_guard lock(mutex_);
    std::size_t n = 0;
    for (const auto& [name, s] : rules_) n += s->limiter->size() + (s->tenants ? s->tenants->size() : 0);
    return n;
  }

 private:
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
};

}  // namespace

std::unique_ptr<memory_backend> make_memory_backend(const memory_backend_options& options) {
  memory_backend_options o = options;
  if (o.clock == nullptr) o.clock = &real_clock();
  if (o.max_keys_per_rule == 0) o.max_keys_per_rule = 1;
  return std::make_unique<memory_backend_impl>(o);
}

}  // namespace sluice
