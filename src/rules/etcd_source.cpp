// SPDX-License-Identifier: Apache-2.0
#include "rules/etcd_source.hpp"

#include <algorithm>
#include <atomic>

#include "sluice/etcd/prefix_watcher.hpp"

namespace sluice::server {

namespace {

class watched_prefix final : public etcd_source {
 public:
  explicit watched_prefix(std::function<void()> changed) : changed_(std::move(changed)) {}

  result<void> start(const etcd_settings& s) {
    prefix_ = s.options.prefix;
    auto w = etcd::prefix_watcher::create(s.options, [this](const etcd::watch_update&) {
      if (!pending_.exchange(true)) changed_();
    });
    if (!w) return error(errc::config_invalid, w.error().message);  // a bad [etcd] setting of sluiced
    watcher_ = std::move(*w);
    return {};
  }

  state read() override {
    pending_.store(false);  // before reading: a change from now on calls changed_ again
    state out;
    auto [entries, st] = watcher_->current();
    for (auto& [key, e] : entries) out.values.push_back({key, std::move(e.value), e.mod_revision});
    out.status = {.name = "etcd",
                  .connected = st.connected,
                  .revision = st.revision,
                  .detail = st.connected ? "" : st.last_error};  // the last error is history once connected
    // A version the watcher left out is a rejected version of its key, not a deletion: the rules
    // keep the previous one in force.
    for (const etcd::rejected_key& r : st.rejected) {
      out.values.push_back({.key = r.key, .mod_revision = r.mod_revision, .left_out = r.reason});
      out.status.rejected.push_back({prefix_ + r.key, r.mod_revision, r.reason});
    }
    // In key order; a key cut short (over max_key_bytes) never hides one the watcher holds.
    auto by_key = [](const etcd_value& a, const etcd_value& b) { return a.key < b.key; };
    std::stable_sort(out.values.begin(), out.values.end(), by_key);
    const auto same_key = [](const etcd_value& a, const etcd_value& b) { return a.key == b.key; };
    out.values.erase(std::unique(out.values.begin(), out.values.end(), same_key), out.values.end());
    return out;
  }

 private:
  std::function<void()> changed_;
  std::string prefix_;
  std::atomic<bool> pending_{false};
  std::unique_ptr<etcd::prefix_watcher> watcher_;  // last: destroyed first, joining its thread
};

}  // namespace

result<std::unique_ptr<etcd_source>> etcd_source::start(const etcd_settings& settings, std::function<void()> changed) {
  auto source = std::make_unique<watched_prefix>(std::move(changed));
  if (auto ok = source->start(settings); !ok) return error(ok.error().code, "[etcd]: " + ok.error().message);
  return std::unique_ptr<etcd_source>(std::move(source));
}

}  // namespace sluice::server
