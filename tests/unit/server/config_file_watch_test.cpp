// SPDX-License-Identifier: Apache-2.0
// When sluiced applies a changed config file: only once it has held still for `settle`, and for
// `settle_removal` when it would remove rules.
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
  watch.mark_loaded(watch.current());
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
  watch.mark_loaded(watch.current());  // the new content is what got loaded (e.g. by SIGHUP)
  EXPECT_FALSE(watch.settling());
  EXPECT_FALSE(watch.changed(t0_ + 10s));
}

// A writer that pauses mid-file leaves what looks like a config without its last rules: such a
// change is applied only once the file has held still for settle_removal.
TEST_F(config_file_watch_test, AChangeThatRemovesRulesWaitsLonger) {
  config_file_watch watch(path_);
  write("bb");
  EXPECT_FALSE(watch.changed(t0_));
  ASSERT_TRUE(watch.changed(t0_ + config_file_watch::settle));
  EXPECT_TRUE(watch.hold_removal(t0_ + config_file_watch::settle));  // held: not applied
  EXPECT_TRUE(watch.settling());
  EXPECT_FALSE(watch.changed(t0_ + config_file_watch::settle_removal - 1ms));
  ASSERT_TRUE(watch.changed(t0_ + config_file_watch::settle_removal));
  EXPECT_FALSE(watch.hold_removal(t0_ + config_file_watch::settle_removal));  // held still long enough: apply
  watch.mark_loaded(watch.current());
  EXPECT_FALSE(watch.changed(t0_ + 10s));
}

TEST_F(config_file_watch_test, TheWriterFinishingEndsTheHold) {
  config_file_watch watch(path_);
  write("bb");
  EXPECT_FALSE(watch.changed(t0_));
  ASSERT_TRUE(watch.changed(t0_ + config_file_watch::settle));
  EXPECT_TRUE(watch.hold_removal(t0_ + config_file_watch::settle));
  write("bb and the rest");  // the rest of the file: a change like any other
  const auto later = t0_ + 1s;
  EXPECT_FALSE(watch.changed(later));
  EXPECT_TRUE(watch.changed(later + config_file_watch::settle));
}

TEST_F(config_file_watch_test, AWriteDuringTheReadIsSeenAfterIt) {
  config_file_watch watch(path_);
  write("bb");
  const config_file_watch::stamp read = watch.current();  // taken before the file is read
  write("ccc");                                           // written while it was being read
  watch.mark_loaded(read);
  EXPECT_FALSE(watch.changed(t0_));
  EXPECT_TRUE(watch.changed(t0_ + config_file_watch::settle));
}

TEST_F(config_file_watch_test, ASighupIsNeverHeld) {
  config_file_watch watch(path_);
  EXPECT_FALSE(watch.hold_removal(t0_)) << "no change reported by the watch: the operator asked";
}

TEST_F(config_file_watch_test, RemovedFileCountsAsAChange) {
  config_file_watch watch(path_);
  std::filesystem::remove(path_);
  EXPECT_FALSE(watch.changed(t0_));
  EXPECT_TRUE(watch.changed(t0_ + config_file_watch::settle));  // the reload then reports the error
}

}  // namespace
