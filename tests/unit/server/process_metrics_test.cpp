// SPDX-License-Identifier: Apache-2.0
// The standard process metrics, read from /proc at a scrape: every family present, each value what
// this very process has (its memory, its descriptors, its start within the last hour).
#include "server/process_metrics.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <sstream>
#include <string>

namespace sluice::server {
namespace {

std::map<std::string, double> samples() {
  std::string out;
  append_process_metrics(out);
  std::map<std::string, double> values;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    const auto space = line.find(' ');
    values[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return values;
}

TEST(ProcessMetrics, EveryFamilyWithThisProcesssValues) {
  auto v = samples();
  for (const char* name : {"process_cpu_seconds_total", "process_resident_memory_bytes", "process_virtual_memory_bytes",
                           "process_open_fds", "process_max_fds", "process_start_time_seconds"}) {
    EXPECT_TRUE(v.count(name)) << name;
  }
  EXPECT_GT(v["process_resident_memory_bytes"], 1 << 20) << "a process holds at least a MiB";
  EXPECT_GE(v["process_virtual_memory_bytes"], v["process_resident_memory_bytes"]);
  EXPECT_GE(v["process_max_fds"], v["process_open_fds"]);
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_LE(v["process_start_time_seconds"], now + 1);
  EXPECT_GT(v["process_start_time_seconds"], now - 3600) << "this test started within the hour";
  // One more descriptor open, one more counted.
  const int fd = ::open("/dev/null", O_RDONLY);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(samples()["process_open_fds"], v["process_open_fds"] + 1);
  ::close(fd);
}

}  // namespace
}  // namespace sluice::server
