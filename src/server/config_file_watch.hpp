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
/// update). Time is passed in. Not thread-safe.
class config_file_watch {
 public:
  using clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds settle{500};

  /// Takes the file as it is now as the loaded version.
  explicit config_file_watch(std::string path);

  const std::string& path() const { return path_; }

  /// Takes the file as it is now as the loaded version: called as the file is read.
  void mark_loaded();

  /// True once the file differs from the loaded version and has kept the same stamp for `settle`.
  bool changed(clock::time_point now);

  /// A change waits to settle: poll again within `settle`.
  bool settling() const { return pending_.has_value(); }

 private:
  struct stamp {
    std::int64_t mtime_ns = -1;
    std::int64_t size = -1;
    std::uint64_t inode = 0;
    friend bool operator==(const stamp&, const stamp&) = default;
  };
  static stamp stamp_of(const std::string& path);

  std::string path_;
  stamp loaded_;
  std::optional<stamp> pending_;  // a change waiting to settle
  clock::time_point pending_since_;
};

}  // namespace sluice::server
