// SPDX-License-Identifier: Apache-2.0
// The prefix watcher when etcd fails: killed and restarted, changed while out of the watcher's
// reach, compacted meanwhile, down when the watcher starts. The watch resumes at the next
// revision (nothing missed, nothing applied twice) or, when that revision is compacted away, the
// prefix is read again.
//
// "Out of reach": etcd restarted on another client port with the same data, so the test can
// change and compact it while the watcher cannot see it — no race with the watcher's backoff.
//
// And against a fake etcd that misbehaves on purpose (fake_etcd.hpp): a Range that answers `more`
// forever, a watch canceled or compacted as soon as it is made. The watcher keeps its snapshot,
// says why, and backs off instead of reading the prefix again and again.
#include "sluice/etcd/prefix_watcher.hpp"

#include <gtest/gtest.h>

#include <chrono>

#include "integration/etcd/etcd_server.hpp"
#include "integration/etcd/fake_etcd.hpp"
#include "integration/etcd/watch_recorder.hpp"

namespace sluice::etcd {
namespace {

using namespace std::chrono_literals;
using sluice::testing::count_of;
using sluice::testing::etcd_server;
using sluice::testing::events_in;
using sluice::testing::fake_etcd;
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

// The fake's prefix at revision 5: one key, "a" = "1".
grpc::Status one_key(const etcdserverpb::RangeRequest&, etcdserverpb::RangeResponse& resp) {
  resp.mutable_header()->set_revision(5);
  auto* kv = resp.add_kvs();
  kv->set_key("/sluice/a");
  kv->set_value("1");
  kv->set_create_revision(4);
  kv->set_mod_revision(5);
  return grpc::Status::OK;
}

TEST(PrefixWatcherFaultTest, ARangeThatNeverEndsFailsAtThePageCapAndIsTriedAgainLater) {
  // The first read is sound; every later one is answered page after page with `more`, each page a
  // new key, forever. max_keys 16 caps a read at 64 + 16 / 8 = 66 pages.
  fake_etcd etcd(
      [](std::size_t read, const etcdserverpb::RangeRequest& req, etcdserverpb::RangeResponse& resp) {
        if (read == 0) return one_key(req, resp);
        resp.mutable_header()->set_revision(9);
        auto* kv = resp.add_kvs();
        kv->set_key(req.key());  // the key asked for: the next page asks for the one after it
        kv->set_value("endless");
        kv->set_mod_revision(9);
        resp.set_more(true);
        return grpc::Status::OK;
      },
      fake_etcd::cancel_when_created(0));  // so that the next session reads the prefix again
  auto o = test_options(etcd.endpoint());
  o.max_keys = 16;
  o.backoff_base = 100ms;
  o.backoff_cap = 400ms;
  recorded_watcher x(o);
  ASSERT_TRUE(x.rec.wait_until([&] { return etcd.reads_started().size() >= 3; })) << x.w->status().last_error;

  const auto s = x.w->status();
  EXPECT_NE(s.last_error.find("failed: the prefix takes more than 66 pages to read"), std::string::npos)
      << s.last_error;
  EXPECT_EQ(x.w->entries(), (snapshot{{"a", {.value = "1", .create_revision = 4, .mod_revision = 5}}}))
      << "the snapshot of the last complete read stays";
  EXPECT_EQ(s.revision, 5);
  EXPECT_EQ(s.full_reads, 1u);
  const std::size_t pages = etcd.pages();
  const auto reads = etcd.reads_started();
  EXPECT_GE(reads[2] - reads[1], 50ms) << "a failed read is tried again after the backoff";
  EXPECT_LE(pages, 1 + 66 * (reads.size() - 1)) << "no read goes past the cap";
}

// A watch that ends as soon as it is made calls for a full read each time; these back off,
// doubling (jittered down to half) from backoff_base up to backoff_cap, as clientv3 does.
void full_reads_back_off(std::int64_t compact_revision) {
  fake_etcd etcd([](std::size_t, const etcdserverpb::RangeRequest& req,
                    etcdserverpb::RangeResponse& resp) { return one_key(req, resp); },
                 fake_etcd::cancel_when_created(compact_revision));
  auto o = test_options(etcd.endpoint());
  o.backoff_base = 50ms;
  o.backoff_cap = 400ms;
  recorded_watcher x(o);
  ASSERT_TRUE(x.rec.wait_until([&] { return etcd.reads_started().size() >= 6; })) << x.w->status().last_error;

  const auto reads = etcd.reads_started();
  for (std::size_t i = 1; i < 6; ++i) EXPECT_GE(reads[i] - reads[i - 1], 25ms) << "read " << i;
  EXPECT_GE(reads[5] - reads[4], 150ms) << "the fifth wait: at least half of min(400 ms, 50 ms x 2^5)";
  EXPECT_EQ(x.w->entries(), (snapshot{{"a", {.value = "1", .create_revision = 4, .mod_revision = 5}}}));
  EXPECT_EQ(x.w->status().revision, 5);
}

TEST(PrefixWatcherFaultTest, FullReadsAfterWatchesCompactedAtOnceBackOff) { full_reads_back_off(3); }

TEST(PrefixWatcherFaultTest, FullReadsAfterWatchesCanceledAtOnceBackOff) { full_reads_back_off(0); }

}  // namespace
}  // namespace sluice::etcd
