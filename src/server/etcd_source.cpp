#include "server/etcd_source.hpp"

#include <atomic>

#include "sluice/etcd/prefix_watcher.hpp"

namespace sluice::server {

namespace {

class watched_prefix final : public etcd_source {
 public:
  explicit watched_prefix(std::function<void()> changed) : changed_(std::move(changed)) {}

  result<void> start(const etcd_settings& s) {
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
    for (auto& [key, e] : watcher_->entries()) out.values.push_back({key, std::move(e.value), e.mod_revision});
    const etcd::watch_status st = watcher_->status();
    out.status = {.name = "etcd", .connected = st.connected, .revision = st.revision, .detail = st.last_error};
    return out;
  }

 private:
  std::function<void()> changed_;
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
