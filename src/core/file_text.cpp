// SPDX-License-Identifier: Apache-2.0
#include "core/file_text.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace sluice::detail {
namespace {

std::string size_text(std::size_t bytes) {
  constexpr std::size_t mib = 1 << 20;
  return bytes > 0 && bytes % mib == 0 ? std::to_string(bytes / mib) + " MiB" : std::to_string(bytes) + " bytes";
}

// Closes the descriptor on every way out.
struct descriptor {
  int fd;
  ~descriptor() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

result<std::string> read_file_text(const std::string& path, std::size_t max_bytes) {
  auto fail = [&](const std::string& why) { return error(errc::config_invalid, path + ": " + why); };
  // O_NONBLOCK: opening a FIFO without a writer must not wait for one.
  const descriptor f{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY)};
  if (f.fd < 0) return fail(std::string("cannot open the file (") + std::strerror(errno) + ")");
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) return fail(std::string("cannot read the file (") + std::strerror(errno) + ")");
  if (S_ISDIR(st.st_mode)) return fail("is a directory, not a file");
  if (!S_ISREG(st.st_mode)) return fail("not a regular file (a FIFO, socket or device)");
  // The size fstat reports may be wrong (a file growing, /proc): read up to the bound, no further.
  std::string text;
  char buf[64 * 1024];
  while (text.size() <= max_bytes) {
    const std::size_t want = std::min(sizeof buf, max_bytes + 1 - text.size());
    const ssize_t n = ::read(f.fd, buf, want);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail(std::string("cannot read the file (") + std::strerror(errno) + ")");
    if (n == 0) return text;
    text.append(buf, static_cast<std::size_t>(n));
  }
  return fail("larger than " + size_text(max_bytes));
}

}  // namespace sluice::detail
