// SPDX-License-Identifier: Apache-2.0
// Every file sluice reads (configs, Envoy YAML, traffic patterns, CSV) is read by read_file_text:
// regular files only, never blocking on a FIFO, never more than the bound.
#include "core/file_text.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace {

using sluice::detail::read_file_text;

class FileText : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sluice-file-text-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string dir_;
};

TEST_F(FileText, ReadsARegularFileUpToTheBound) {
  const std::string path = dir_ + "/a.toml";
  std::ofstream(path) << std::string(100, 'x');
  auto text = read_file_text(path, 100);
  ASSERT_TRUE(text.ok()) << text.error().message;
  EXPECT_EQ(*text, std::string(100, 'x'));
  auto over = read_file_text(path, 99);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.error().message, path + ": larger than 99 bytes");
  EXPECT_EQ(read_file_text(path, 0).error().message, path + ": larger than 0 bytes");
  std::ofstream(path, std::ios::trunc).flush();
  EXPECT_EQ(read_file_text(path, 0).value(), "");
}

TEST_F(FileText, RefusesWhatIsNotARegularFile) {
  const std::string fifo = dir_ + "/fifo.toml";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto started = std::chrono::steady_clock::now();
  auto from_fifo = read_file_text(fifo, 1 << 20);  // no writer: must not wait for one
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5));
  ASSERT_FALSE(from_fifo.ok());
  EXPECT_EQ(from_fifo.error().message, fifo + ": not a regular file (a FIFO, socket or device)");
  auto zero = read_file_text("/dev/zero", 16 << 20);
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.error().message, "/dev/zero: not a regular file (a FIFO, socket or device)");
  auto dir = read_file_text(dir_, 1 << 20);
  ASSERT_FALSE(dir.ok());
  EXPECT_EQ(dir.error().message, dir_ + ": is a directory, not a file");
  EXPECT_EQ(read_file_text(dir_ + "/missing", 1).error().message,
            dir_ + "/missing: cannot open the file (No such file or directory)");
}

}  // namespace
