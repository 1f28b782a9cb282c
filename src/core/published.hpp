// SPDX-License-Identifier: Apache-2.0
// One immutable value — a config snapshot, a rule set, an Envoy config — published to many readers.
// publish() swaps it under a lock; each reader keeps a view of its own and takes the lock only after
// a publish, so a read on the hot path is one acquire load. A view's pointer counts on a control
// block private to that view: copies of it (one per request) bounce no reference count between
// cores. A reader whose view falls behind keeps the older value alive until its next read.
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <utility>

namespace sluice {

namespace detail {
inline std::atomic<std::uint64_t> next_published_id{1};
}

template <class T>
class published {
 public:
  /// A reader's own copy; one per thread (a worker, or a thread_local). Not thread-safe itself.
  struct view {
    std::uint64_t holder = 0;  // the published it was read from: a view moved to another holder re-reads
    std::uint64_t version = std::numeric_limits<std::uint64_t>::max();
    std::shared_ptr<const T> value;
  };

  explicit published(std::shared_ptr<const T> first) : value_(std::move(first)) {}
  published(const published&) = delete;
  published& operator=(const published&) = delete;

  /// Readers see `next` from their next read on; reads already made keep what they got.
  void publish(std::shared_ptr<const T> next) {
    std::lock_guard lock(mu_);
    value_ = std::move(next);
    version_.fetch_add(1, std::memory_order_release);
  }

  /// The value now, through `v`: one acquire load, and the lock only when a publish came since `v`
  /// last read. Valid until `v`'s next read.
  const std::shared_ptr<const T>& read(view& v) const {
    if (v.holder != id_ || v.version != version_.load(std::memory_order_acquire)) {
      std::lock_guard lock(mu_);
      auto own = std::make_shared<std::shared_ptr<const T>>(value_);
      v.value = std::shared_ptr<const T>(own, own->get());
      v.version = version_.load(std::memory_order_relaxed);
      v.holder = id_;
    }
    return v.value;
  }

  /// The value now, copied under the lock: for reads off the hot path.
  std::shared_ptr<const T> load() const {
    std::lock_guard lock(mu_);
    return value_;
  }

 private:
  const std::uint64_t id_ = detail::next_published_id.fetch_add(1, std::memory_order_relaxed);
  mutable std::mutex mu_;
  std::shared_ptr<const T> value_;  // guarded by mu_
  std::atomic<std::uint64_t> version_{0};
};

}  // namespace sluice
