// SPDX-License-Identifier: Apache-2.0
#include "etcd/publisher.hpp"

namespace sluice::etcd::detail {

void publisher::watching(const std::string& endpoint, std::optional<prefix_state> fresh) {
  bool was_connected = false;
  {
    std::lock_guard lock(mu_);
    if (fresh) {
      state_.replace_with(std::move(*fresh));
      ++status_.full_reads;
      sync_locked();
    }
    was_connected = status_.connected && status_.endpoint == endpoint;
    if (!was_connected) ++status_.connects;
    status_.connected = true;
    status_.endpoint = endpoint;
  }
  if (fresh) {
    deliver(update_kind::full_read, 0);
  } else if (!was_connected) {
    deliver(update_kind::status, 0);
  }
}

void publisher::changes(std::span<const change> events) {
  std::size_t applied = 0;
  {
    std::lock_guard lock(mu_);
    applied = state_.apply(events);
    sync_locked();
  }
  if (applied > 0) deliver(update_kind::changes, applied);
}

void publisher::progress(std::int64_t r) {
  std::lock_guard lock(mu_);
  state_.advance_to(r);
  sync_locked();
}

void publisher::disconnected(const std::string& endpoint, const std::string& why) {
  {
    std::lock_guard lock(mu_);
    if (!status_.connected && status_.endpoint == endpoint && status_.last_error == why) return;
    status_.connected = false;
    status_.endpoint = endpoint;
    status_.last_error = why;
  }
  deliver(update_kind::status, 0);
}

watch_status publisher::status() const {
  std::lock_guard lock(mu_);
  return status_;
}

snapshot publisher::entries() const {
  std::lock_guard lock(mu_);
  return state_.entries();
}

std::pair<snapshot, watch_status> publisher::current() const {
  std::lock_guard lock(mu_);
  return {state_.entries(), status_};
}

void publisher::sync_locked() {
  status_.revision = state_.revision();
  status_.rejected_total = state_.rejected_total();
  if (listed_generation_ != state_.rejected_generation()) {
    status_.rejected = state_.rejected();
    listed_generation_ = state_.rejected_generation();
  }
}

void publisher::deliver(update_kind kind, std::size_t events) {
  if (!on_update_) return;
  on_update_(watch_update{.kind = kind, .entries = state_.entries(), .status = status_, .events = events});
}

}  // namespace sluice::etcd::detail
