// SPDX-License-Identifier: Apache-2.0
// src/core/file_text.hpp (private) — a file given on a command line or in a config, read whole and
// bounded: every config, pattern, CSV and YAML file sluice reads goes through it.
//
//   auto text = detail::read_file_text(path, 16 << 20);  // error: "PATH: is a directory", ...
//
// Only a regular file is read: a FIFO, socket or device (/dev/zero) is refused without blocking
// (it is opened with O_NONBLOCK and checked with fstat), and at most `max_bytes` + 1 bytes are
// read whatever the file claims. Thread-safe.
#pragma once

#include <cstddef>
#include <string>

#include "sluice/error.hpp"

namespace sluice::detail {

/// The file's bytes, or errc::config_invalid with a message starting "PATH: ": it cannot be
/// opened or read, it is a directory, it is not a regular file, or it is larger than `max_bytes`.
result<std::string> read_file_text(const std::string& path, std::size_t max_bytes);

}  // namespace sluice::detail
