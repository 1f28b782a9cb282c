#include "sluice/server/etcd_rule_source.hpp"

#include <condition_variable>
#include <mutex>
#include <thread>

#include "server/etcd_source.hpp"
#include "server/rule_sources.hpp"

namespace sluice::server {

struct etcd_rule_source::impl {
  impl(backend& b, std::vector<rule> d, callback cb, const std::string& prefix)
      : backend_(b),
        defaults(std::move(d)),
        on_rules(std::move(cb)),
        rules(prefix, [this](const rule& r) -> result<void> {
          auto p = backend_.prepare(r);
          if (!p) return p.error();
          return {};
        }) {}

  // On the source's thread: waits for a change, applies it, delivers the new set.
  void run() {
    for (;;) {
      {
        std::unique_lock lock(mu);
        wake.wait(lock, [&] { return stop || pending; });
        if (stop) return;
        pending = false;
      }
      apply();
    }
  }

  void apply() {
    etcd_source::state state = source->read();
    bool changed = false;
    const std::size_t rejected = rules.apply(state.values, changed).size();
    std::shared_ptr<const rule_set> next;
    if (changed) {
      auto built = rule_set::build(backend_, merge_rules(defaults, &rules).rules, {.source = "etcd"}, current().get());
      if (built) next = std::move(*built);
    }
    {
      std::lock_guard lock(mu);
      status = state.status;
      errors += rejected + (changed && !next ? 1 : 0);
      if (next) in_force = next;
    }
    if (next) on_rules(std::move(next));
  }

  std::shared_ptr<const rule_set> current() const {
    std::lock_guard lock(mu);
    return in_force;
  }

  backend& backend_;
  const std::vector<rule> defaults;
  const callback on_rules;
  etcd_rules rules;  // the source's thread only
  mutable std::mutex mu;
  std::condition_variable wake;
  bool pending = false;                                           // guarded by mu
  bool stop = false;                                              // guarded by mu
  std::shared_ptr<const rule_set> in_force;                       // guarded by mu
  rule_source_status status{.name = "etcd", .connected = false};  // guarded by mu
  std::uint64_t errors = 0;                                       // guarded by mu
  std::unique_ptr<etcd_source> source;                            // its thread calls `wake`: destroyed before the rest
  std::thread thread;
};

result<std::unique_ptr<etcd_rule_source>> etcd_rule_source::start(const etcd_settings& settings, backend& b,
                                                                  std::vector<rule> defaults, callback on_rules) {
  auto first = rule_set::build(b, defaults, {.source = "defaults"}, nullptr);
  if (!first) return first.error();
  auto p = std::make_unique<impl>(b, std::move(defaults), std::move(on_rules), settings.options.prefix);
  p->in_force = *first;
  p->on_rules(std::move(*first));
  impl* self = p.get();
  auto source = etcd_source::start(settings, [self] {
    std::lock_guard lock(self->mu);
    self->pending = true;
    self->wake.notify_one();
  });
  if (!source) return source.error();
  p->source = std::move(*source);
  p->thread = std::thread([self] { self->run(); });
  return std::unique_ptr<etcd_rule_source>(new etcd_rule_source(std::move(p)));
}

etcd_rule_source::etcd_rule_source(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

etcd_rule_source::~etcd_rule_source() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stop = true;
    impl_->wake.notify_one();
  }
  impl_->thread.join();
  impl_->source.reset();  // joins the watcher's thread, the last to touch `wake`
}

std::shared_ptr<const rule_set> etcd_rule_source::current() const { return impl_->current(); }

rule_source_status etcd_rule_source::status() const {
  std::lock_guard lock(impl_->mu);
  return impl_->status;
}

std::uint64_t etcd_rule_source::errors() const {
  std::lock_guard lock(impl_->mu);
  return impl_->errors;
}

}  // namespace sluice::server
