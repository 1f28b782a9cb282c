// SPDX-License-Identifier: Apache-2.0
#include "server/config_file_watch.hpp"

#include <sys/stat.h>

namespace sluice::server {

config_file_watch::config_file_watch(std::string path) : path_(std::move(path)), loaded_(stamp_of(path_)) {}

void config_file_watch::mark_loaded(const stamp& read) {
  loaded_ = read;
  pending_.reset();
}

bool config_file_watch::changed(clock::time_point now) {
  const stamp current = stamp_of(path_);
  if (current == loaded_) {
    pending_.reset();
  } else if (!pending_ || !(*pending_ == current)) {
    pending_ = current;  // changed (again): wait for it to settle
    pending_since_ = now;
    held_ = false;
  } else {
    return now - pending_since_ >= (held_ ? std::chrono::milliseconds(settle_removal) : settle);
  }
  return false;
}

bool config_file_watch::hold_removal(clock::time_point now) {
  if (!pending_) return false;  // not a change the watch reported (SIGHUP): the operator asked
  held_ = true;
  return now - pending_since_ < settle_removal;
}

config_file_watch::stamp config_file_watch::stamp_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  return {static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec,
          static_cast<std::int64_t>(st.st_size), static_cast<std::uint64_t>(st.st_ino)};
}

}  // namespace sluice::server
