#include "sluice/memory_backend.hpp"

#include <map>
#include <mutex>
#include <string>

#include "sluice/keyed.hpp"

namespace sluice {
namespace {

// The state of one rule: its keyed limiter, and the tenant layer's for dual-layer rules.
struct rule_state {
  rule definition;
  std::unique_ptr<keyed_limiter> limiter;
  std::unique_ptr<keyed_limiter> tenants;
};

class memory_backend_impl final : public memory_backend {
 public:
  explicit memory_backend_impl(const memory_backend_options& o) : options_(o) {}

  result<decision> check(const check_request& req) override {
    if (auto v = validate(req); !v) return v.error();
    auto state = state_for(*req.rule);
    if (!state) return state.error();
    const time_point now = options_.clock->now();
    rule_state& s = **state;
    if (s.tenants) return keyed_limiter::try_acquire_dual(*s.tenants, req.tenant, *s.limiter, req.user, now, req.cost);
    return s.limiter->try_acquire(req.key, now, req.cost);
  }

  void async_check(const check_request& req, check_handler handler) override { handler(check(req)); }

  bool ready() override { return true; }

  void forget_rule(std::string_view name) override {
    std::lock_guard lock(mutex_);
    if (auto it = rules_.find(name); it != rules_.end()) rules_.erase(it);
  }

  std::size_t key_count() override {
    std::lock_guard lock(mutex_);
    std::size_t n = 0;
    for (const auto& [name, s] : rules_) n += s->limiter->size() + (s->tenants ? s->tenants->size() : 0);
    return n;
  }

 private:
  // The rule's state, created on first use; a rule whose definition changed starts afresh.
  result<std::shared_ptr<rule_state>> state_for(const rule& r) {
    std::lock_guard lock(mutex_);
    auto it = rules_.find(r.name);
    if (it != rules_.end() && it->second->definition == r) return it->second;
    if (auto v = validate(r); !v) return v.error();
    auto s = std::make_shared<rule_state>();
    s->definition = r;
    auto make = [&](const policy& p) {
      return keyed_limiter::create({.policy = p, .max_keys = options_.max_keys_per_rule, .clock = options_.clock});
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
    return s;
  }

  const memory_backend_options options_;
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
