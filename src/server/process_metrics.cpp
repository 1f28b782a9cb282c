// SPDX-License-Identifier: Apache-2.0
#include "server/process_metrics.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "sluice/prometheus.hpp"

namespace sluice::server {
namespace {

// The fields of /proc/self/stat after the command name (which may hold spaces and parentheses):
// fields[0] is the state (field 3 of proc(5)).
std::vector<std::string> stat_fields() {
  std::ifstream f("/proc/self/stat");
  std::string line;
  std::getline(f, line);
  const auto close = line.rfind(')');
  if (close == std::string::npos) return {};
  std::istringstream rest(line.substr(close + 1));
  std::vector<std::string> fields;
  for (std::string v; rest >> v;) fields.push_back(v);
  return fields;
}

// proc(5)'s field `n` (1-based) of /proc/self/stat, as a number.
std::optional<double> stat_field(const std::vector<std::string>& fields, std::size_t n) {
  if (n < 3 || n - 3 >= fields.size()) return std::nullopt;
  try {
    return std::stod(fields[n - 3]);
  } catch (...) {
    return std::nullopt;
  }
}

// When the machine booted, in seconds since the epoch (/proc/stat's btime).
std::optional<double> boot_time() {
  std::ifstream f("/proc/stat");
  for (std::string key; f >> key;) {
    if (key == "btime") {
      double v = 0;
      if (f >> v) return v;
      return std::nullopt;
    }
    f.ignore(1 << 20, '\n');
  }
  return std::nullopt;
}

void gauge(std::string& out, const char* name, const char* type, const char* help, std::optional<double> v) {
  if (!v) return;
  prometheus::family(out, name, type, help);
  prometheus::sample(out, name, *v);
}

}  // namespace

void append_process_metrics(std::string& out) {
  const auto fields = stat_fields();
  const double ticks = static_cast<double>(::sysconf(_SC_CLK_TCK));
  const auto utime = stat_field(fields, 14), stime = stat_field(fields, 15);
  const auto start = stat_field(fields, 22), vsize = stat_field(fields, 23), rss = stat_field(fields, 24);
  const auto boot = boot_time();
  const double page = static_cast<double>(::sysconf(_SC_PAGESIZE));

  gauge(out, "process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.",
        utime && stime ? std::optional((*utime + *stime) / ticks) : std::nullopt);
  gauge(out, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.",
        rss ? std::optional(*rss * page) : std::nullopt);
  gauge(out, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", vsize);
  std::error_code ec;
  std::size_t fds = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++fds;
  }
  gauge(out, "process_open_fds", "gauge", "Number of open file descriptors.",
        ec ? std::nullopt : std::optional(static_cast<double>(fds)));
  rlimit limit{};
  gauge(out, "process_max_fds", "gauge", "Maximum number of open file descriptors.",
        ::getrlimit(RLIMIT_NOFILE, &limit) == 0 ? std::optional(static_cast<double>(limit.rlim_cur)) : std::nullopt);
  gauge(out, "process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.",
        start && boot ? std::optional(*boot + *start / ticks) : std::nullopt);
}

}  // namespace sluice::server
