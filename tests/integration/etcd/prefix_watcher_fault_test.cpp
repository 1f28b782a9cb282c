// The prefix watcher when etcd fails: killed and restarted, changed while out of the watcher's
// reach, compacted meanwhile, down when the watcher starts. The watch resumes at the next
// revision (nothing missed, nothing applied twice) or, when that revision is compacted away, the
// prefix is read again.
//
// "Out of reach": etcd restarted on another client port with the same data, so the test can
// change and compact it while the watcher cannot see it — no race with the watcher's backoff.
#include "sluice/etcd/prefix_watcher.hpp"

#include <gtest/gtest.h>

#include <chrono>

#include "integration/etcd/etcd_server.hpp"
#include "integration/etcd/watch_recorder.hpp"

namespace sluice::etcd {
namespace {

using namespace std::chrono_literals;
using sluice::testing::count_of;
using sluice::testing::etcd_server;
using sluice::testing::events_in;
using sluice::testing::recorded_watcher;
using sluice::testing::revisions_increase;
using sluice::testing::test_options;

TEST(PrefixWatcherFaultTest, ResumesAfterARestartWithoutMissingOrRepeating) {
  etcd_server etcd;
  etcd.put("/sluice/a", "1");
  recorded_watcher x(test_options(etcd.endpoint()));
  ASSERT_TRUE(x.connected()) << x.w->status().last_error;
  const auto b = etcd.put("/sluice/b", "1");
  ASSERT_TRUE(x.at(b));

  etcd.kill();
  ASSERT_TRUE(x.disconnected());
  EXPECT_FALSE(x.w->status().last_error.empty());
  EXPECT_EQ(x.w->entries().size(), 2u);  // the snapshot stays while etcd is away
  etcd.restart();
  ASSERT_TRUE(x.connected()) << x.w->status().last_error;
  const auto c = etcd.put("/sluice/c", "after the restart");
  ASSERT_TRUE(x.at(c));

  EXPECT_EQ(x.w->entries().at("c").value, "after the restart");
  EXPECT_EQ(x.w->entries().size(), 3u);
  const auto s = x.w->status();
  EXPECT_EQ(s.full_reads, 1u);  // resumed, not read again
  EXPECT_EQ(s.connects, 2u);
  const auto log = x.rec.deliveries();
  EXPECT_TRUE(revisions_increase(log));
  EXPECT_EQ(events_in(log), 2u);  // b and c, once each
}

TEST(PrefixWatcherFaultTest, ChangesMadeOutOfReachArriveThroughTheResumedWatch) {
  etcd_server etcd;
  etcd.put("/sluice/a", "1");
  etcd.put("/sluice/b", "1");
  recorded_watcher x(test_options(etcd.endpoint()));
  ASSERT_TRUE(x.connected()) << x.w->status().last_error;

  etcd.kill();
  ASSERT_TRUE(x.disconnected());
  etcd.restart_out_of_reach();
  const auto a_rev = etcd.put("/sluice/a", "2");
  etcd.del("/sluice/b");
  const auto last = etcd.put("/sluice/c", "1");
  etcd.kill();
  etcd.restart();
  ASSERT_TRUE(x.at(last)) << x.w->status().last_error;

  const snapshot got = x.w->entries();
  EXPECT_EQ(got.size(), 2u);
  EXPECT_EQ(got.at("a"), (entry{.value = "2", .create_revision = got.at("a").create_revision, .mod_revision = a_rev}));
  EXPECT_EQ(got.count("b"), 0u);
  EXPECT_EQ(got.at("c").value, "1");
  EXPECT_EQ(x.w->status().full_reads, 1u);
  const auto log = x.rec.deliveries();
  EXPECT_TRUE(revisions_increase(log));
  EXPECT_EQ(events_in(log), 3u);
}

TEST(PrefixWatcherFaultTest, CompactionWhileOutOfReachLeadsToAFullRead) {
  etcd_server etcd;
  const auto a = etcd.put("/sluice/a", "1");
  etcd.put("/sluice/b", "1");
  recorded_watcher x(test_options(etcd.endpoint()));
  ASSERT_TRUE(x.connected()) << x.w->status().last_error;
  const auto before = x.w->status().revision;

  etcd.kill();
  ASSERT_TRUE(x.disconnected());
  etcd.restart_out_of_reach();
  etcd.put("/sluice/a", "2");
  etcd.del("/sluice/b");
  const auto d = etcd.put("/sluice/d", "1");
  const auto last = etcd.put("/sluice/a", "3");
  etcd.compact(last);  // the watcher's next revision (before + 1) is gone
  etcd.kill();
  etcd.restart();
  ASSERT_TRUE(x.at(last)) << x.w->status().last_error;

  const snapshot want = {{"a", {.value = "3", .create_revision = a, .mod_revision = last}},
                         {"d", {.value = "1", .create_revision = d, .mod_revision = d}}};
  EXPECT_EQ(x.w->entries(), want);
  const auto s = x.w->status();
  EXPECT_EQ(s.full_reads, 2u);
  EXPECT_GT(last, before + 1);
  const auto log = x.rec.deliveries();
  EXPECT_EQ(count_of(log, update_kind::full_read), 2u);
  EXPECT_EQ(events_in(log), 0u);  // nothing came through the watch: it was all read again
  EXPECT_TRUE(revisions_increase(log));
  EXPECT_EQ(log.back().kind, update_kind::full_read);
  EXPECT_EQ(log.back().revision, last);
}

TEST(PrefixWatcherFaultTest, StartedWithEtcdDownConnectsWhenItComesUp) {
  etcd_server etcd;
  const auto a = etcd.put("/sluice/a", "1");
  etcd.kill();
  recorded_watcher x(test_options(etcd.endpoint()));
  ASSERT_TRUE(x.failed());
  auto s = x.w->status();
  EXPECT_FALSE(s.connected);
  EXPECT_EQ(s.revision, 0);
  EXPECT_NE(s.last_error.find(etcd.endpoint()), std::string::npos) << s.last_error;
  EXPECT_TRUE(x.w->entries().empty());

  etcd.restart();
  ASSERT_TRUE(x.connected()) << x.w->status().last_error;
  EXPECT_EQ(x.w->entries().at("a"), (entry{.value = "1", .create_revision = a, .mod_revision = a}));
  const auto log = x.rec.deliveries();
  ASSERT_FALSE(log.empty());
  EXPECT_EQ(log.front().kind, update_kind::status);  // the failure to connect came first
  EXPECT_FALSE(log.front().connected);
  EXPECT_EQ(log.back().kind, update_kind::full_read);
}

TEST(PrefixWatcherFaultTest, TriesTheNextEndpoint) {
  etcd_server etcd;
  etcd_server down;
  down.kill();
  const auto a = etcd.put("/sluice/a", "1");
  auto o = test_options(etcd.endpoint());
  o.endpoints = {down.endpoint(), etcd.endpoint()};
  recorded_watcher x(o);
  ASSERT_TRUE(x.connected()) << x.w->status().last_error;
  EXPECT_EQ(x.w->status().endpoint, etcd.endpoint());
  EXPECT_EQ(x.w->entries().at("a").mod_revision, a);
}

}  // namespace
}  // namespace sluice::etcd
