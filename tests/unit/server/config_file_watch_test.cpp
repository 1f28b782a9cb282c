// When sluiced applies a changed config file: only once it has held still for `settle`.
#include "server/config_file_watch.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace {

using sluice::server::config_file_watch;
using namespace std::chrono_literals;

class config_file_watch_test : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sluice-watch-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/sluice.toml";
    write("a");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& text) { std::ofstream(path_, std::ios::trunc) << text; }

  std::string dir_;
  std::string path_;
  config_file_watch::clock::time_point t0_ = config_file_watch::clock::now();
};

TEST_F(config_file_watch_test, UnchangedFileIsNeverReported) {
  config_file_watch watch(path_);
  EXPECT_FALSE(watch.changed(t0_));
  EXPECT_FALSE(watch.changed(t0_ + 10s));
  EXPECT_FALSE(watch.settling());
}

TEST_F(config_file_watch_test, ChangeIsReportedOnceItHasSettled) {
  config_file_watch watch(path_);
  write("bb");
  EXPECT_FALSE(watch.changed(t0_));  // seen: waits to settle
  EXPECT_TRUE(watch.settling());
  EXPECT_FALSE(watch.changed(t0_ + config_file_watch::settle - 1ms));
  EXPECT_TRUE(watch.changed(t0_ + config_file_watch::settle));
  watch.mark_loaded();
  EXPECT_FALSE(watch.changed(t0_ + 10s));
}

TEST_F(config_file_watch_test, FileStillBeingWrittenRestartsTheWait) {
  config_file_watch watch(path_);
  write("bb");
  EXPECT_FALSE(watch.changed(t0_));
  write("ccc");  // written again before settling
  EXPECT_FALSE(watch.changed(t0_ + config_file_watch::settle));
  EXPECT_FALSE(watch.changed(t0_ + 2 * config_file_watch::settle - 1ms));
  EXPECT_TRUE(watch.changed(t0_ + 2 * config_file_watch::settle));
}

TEST_F(config_file_watch_test, ReloadDuringTheWaitTakesTheNewFileAsLoaded) {
  config_file_watch watch(path_);
  write("bb");
  EXPECT_FALSE(watch.changed(t0_));
  watch.mark_loaded();  // the new content is what got loaded (e.g. by SIGHUP)
  EXPECT_FALSE(watch.settling());
  EXPECT_FALSE(watch.changed(t0_ + 10s));
}

TEST_F(config_file_watch_test, RemovedFileCountsAsAChange) {
  config_file_watch watch(path_);
  std::filesystem::remove(path_);
  EXPECT_FALSE(watch.changed(t0_));
  EXPECT_TRUE(watch.changed(t0_ + config_file_watch::settle));  // the reload then reports the error
}

}  // namespace
