// SPDX-License-Identifier: Apache-2.0
#include "sluice/server/etcd_rule_source.hpp"

#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>

#include "core/published.hpp"

#include "rules/etcd_source.hpp"
#include "rules/rule_sources.hpp"

namespace sluice::server {

struct etcd_rule_source::impl {
  impl(backend& b, std::vector<rule> d, callback cb, const std::string& prefix)
      : backend_(b),
        defaults(std::move(d)),
        on_rules(std::move(cb)),
        rules(prefix, [this](const rule& r) { return backend_.validate_rule(r); }) {}

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
    rule_source_status before;
    {
      std::lock_guard lock(mu);
      before = std::exchange(status, state.status);
    }
    if (!follow_etcd(rules, state.values, state.status, before, errors)) return;
    auto next =
        rule_set::build(backend_, merge_rules(defaults, &rules).rules, {.source = "etcd"}, in_force.load().get());
    if (!next) {
      errors.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    in_force.publish(*next);
    if (on_rules) on_rules(std::move(*next));
  }

  backend& backend_;
  const std::vector<rule> defaults;
  const callback on_rules;
  etcd_rules rules;  // the source's thread only
  published<rule_set> in_force{nullptr};
  std::atomic<std::uint64_t> errors{0};
  mutable std::mutex mu;
  std::condition_variable wake;
  bool pending = false;                                           // guarded by mu
  bool stop = false;                                              // guarded by mu
  rule_source_status status{.name = "etcd", .connected = false};  // guarded by mu
  std::unique_ptr<etcd_source> source;                            // its thread calls `wake`: destroyed before the rest
  std::thread thread;
};

result<std::unique_ptr<etcd_rule_source>> etcd_rule_source::start(const etcd_settings& settings, backend& b,
                                                                  std::vector<rule> defaults, callback on_rules) {
  auto first = rule_set::build(b, defaults, {.source = "defaults"}, nullptr);
  if (!first) return first.error();
  auto p = std::make_unique<impl>(b, std::move(defaults), std::move(on_rules), settings.options.prefix);
  p->in_force.publish(*first);
  if (p->on_rules) p->on_rules(std::move(*first));
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

std::shared_ptr<const rule_set> etcd_rule_source::current() const {
  thread_local published<rule_set>::view view;  // each reading thread's: no lock per check
  return impl_->in_force.read(view);
}

rule_source_status etcd_rule_source::status() const {
  std::lock_guard lock(impl_->mu);
  return impl_->status;
}

std::uint64_t etcd_rule_source::errors() const { return impl_->errors.load(std::memory_order_relaxed); }

}  // namespace sluice::server
