// SPDX-License-Identifier: Apache-2.0
// When sluiced reloads its config file: a changed file is applied once it has stopped changing.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace sluice::server {

/// Polled by sluiced's control thread. A change is reported once the file's stamp (mtime, size,
/// inode) has held for `settle`, so a file caught while being written in place is not applied
/// half-written (writing a new file and renaming it over the old one is atomic, and the way to
/// update). A change that would remove rules waits longer (hold_removal): a writer that pauses
/// mid-file must not turn limits off. Time is passed in. Not thread-safe.
class config_file_watch {
 public:
  using clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds settle{500};
  static constexpr std::chrono::seconds settle_removal{5};

  /// What a file was when looked at.
  struct stamp {
    std::int64_t mtime_ns = -1;
    std::int64_t size = -1;
    std::uint64_t inode = 0;
    friend bool operator==(const stamp&, const stamp&) = default;
  };

  /// Takes the file as it is now as the loaded version.
  explicit config_file_watch(std::string path);

  const std::string& path() const { return path_; }

  /// The file's stamp now: taken before the file is read, and given to mark_loaded after, so that a
  /// write during the read is seen as a change.
  stamp current() const { return stamp_of(path_); }

  /// Takes `read` as the loaded version.
  void mark_loaded(const stamp& read);

  /// True once the file differs from the loaded version and has kept the same stamp for `settle`
  /// (`settle_removal` when held); it stays reported until mark_loaded or hold_removal.
  bool changed(clock::time_point now);

  /// The change just reported would remove rules: true while it has not kept its stamp for
  /// `settle_removal` (`changed` then reports it again once it has), false when it has.
  bool hold_removal(clock::time_point now);

  /// A change waits to settle: poll again within `settle`.
  bool settling() const { return pending_.has_value(); }

 private:
  static stamp stamp_of(const std::string& path);

  std::string path_;
  stamp loaded_;
  std::optional<stamp> pending_;  // a change waiting to settle
  clock::time_point pending_since_;
  bool held_ = false;  // pending_ removes rules: it waits settle_removal
};

}  // namespace sluice::server
