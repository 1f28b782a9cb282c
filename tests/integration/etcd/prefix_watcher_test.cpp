// SPDX-License-Identifier: Apache-2.0
// The prefix watcher against a real etcd: the first full read, changes with their revisions,
// bounds on what it holds (over-size values, a flood of keys), and prompt shutdown.
#include "sluice/etcd/prefix_watcher.hpp"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "integration/etcd/etcd_server.hpp"
#include "integration/etcd/kv_writer.hpp"
#include "integration/etcd/watch_recorder.hpp"

namespace sluice::etcd {
namespace {

using namespace std::chrono_literals;
using sluice::testing::etcd_server;
using sluice::testing::recorded_watcher;
using sluice::testing::test_options;

TEST(PrefixWatcherTest, FirstReadHoldsTheKeysOfThePrefixOnly) {
  etcd_server etcd;
  const auto a = etcd.put("/sluice/a", "1");
  const auto b = etcd.put("/sluice/rules/b", "two");
  etcd.put("/sluicex", "not under the prefix");
  etcd.put("/other/c", "nor this");
  const auto last = etcd.put("/sluice/", "the prefix itself");

  recorded_watcher x(test_options(etcd.endpoint()));
  ASSERT_TRUE(x.connected()) << x.w->status().last_error;

  const snapshot want = {{"", {.value = "the prefix itself", .create_revision = last, .mod_revision = last}},
                         {"a", {.value = "1", .create_revision = a, .mod_revision = a}},
                         {"rules/b", {.value = "two", .create_revision = b, .mod_revision = b}}};
  EXPECT_EQ(x.w->entries(), want);
  const auto s = x.w->status();
  EXPECT_EQ(s.revision, last);
  EXPECT_EQ(s.full_reads, 1u);
  EXPECT_EQ(s.connects, 1u);
  EXPECT_EQ(s.endpoint, etcd.endpoint());
  EXPECT_TRUE(s.last_error.empty()) << s.last_error;
  const auto log = x.rec.deliveries();
  ASSERT_EQ(log.size(), 1u);  // the read and the connection are one delivery
  EXPECT_EQ(log[0].kind, update_kind::full_read);
  EXPECT_TRUE(log[0].connected);
  EXPECT_EQ(log[0].keys, 3u);
}

TEST(PrefixWatcherTest, EmptyPrefixWatchesTheWholeKeyspace) {
  etcd_server etcd;
  etcd.put("/sluice/a", "1");
  etcd.put("other", "2");
  auto o = test_options(etcd.endpoint());
  o.prefix = "";
  recorded_watcher x(o);
  ASSERT_TRUE(x.connected()) << x.w->status().last_error;
  ASSERT_TRUE(x.at(etcd.put("\xff", "3")));
  const auto got = x.w->entries();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got.at("/sluice/a").value, "1");
  EXPECT_EQ(got.at("other").value, "2");
  EXPECT_EQ(got.at("\xff").value, "3");
}

TEST(PrefixWatcherTest, PutUpdateAndDeleteArriveWithTheirRevisions) {
  etcd_server etcd;
  recorded_watcher x(test_options(etcd.endpoint()));
  ASSERT_TRUE(x.connected()) << x.w->status().last_error;

  const auto created = etcd.put("/sluice/a", "1");
  ASSERT_TRUE(x.at(created));
  EXPECT_EQ(x.w->entries().at("a"), (entry{.value = "1", .create_revision = created, .mod_revision = created}));

  const auto updated = etcd.put("/sluice/a", "2");
  ASSERT_TRUE(x.at(updated));
  EXPECT_EQ(x.w->entries().at("a"), (entry{.value = "2", .create_revision = created, .mod_revision = updated}));

  const auto deleted = etcd.del("/sluice/a");
  etcd.put("/elsewhere", "x");  // outside the prefix: no delivery
  ASSERT_TRUE(x.at(deleted));
  EXPECT_TRUE(x.w->entries().empty());

  const auto log = x.rec.deliveries();
  EXPECT_EQ(sluice::testing::count_of(log, update_kind::changes), 3u);
  EXPECT_EQ(sluice::testing::events_in(log), 3u);
  EXPECT_TRUE(sluice::testing::revisions_increase(log));
  EXPECT_EQ(log.back().revision, deleted);
}

TEST(PrefixWatcherTest, OverSizeValueIsLeftOutAlone) {
  etcd_server etcd;
  const std::string big(70'000, 'x');
  etcd.put("/sluice/big-before", big);  // met by the full read
  etcd.put("/sluice/small", "ok");
  recorded_watcher x(test_options(etcd.endpoint()));
  ASSERT_TRUE(x.connected()) << x.w->status().last_error;
  EXPECT_EQ(x.w->entries().size(), 1u);
  EXPECT_EQ(x.w->entries().count("small"), 1u);

  etcd.put("/sluice/big-after", big);  // met by the watch
  ASSERT_TRUE(x.at(etcd.put("/sluice/small", "still ok")));
  EXPECT_EQ(x.w->entries().at("small").value, "still ok");
  auto s = x.w->status();
  EXPECT_EQ(s.rejected_total, 2u);
  ASSERT_EQ(s.rejected.size(), 2u);
  EXPECT_EQ(s.rejected[0].key, "big-before");
  EXPECT_EQ(s.rejected[1].key, "big-after");
  EXPECT_EQ(s.rejected[1].reason, "value of 70000 bytes is over max_value_bytes (65536)");
  EXPECT_EQ(x.w->entries().size(), 1u);

  // Made small again: accepted, and off the list.
  ASSERT_TRUE(x.at(etcd.put("/sluice/big-after", "small now")));
  s = x.w->status();
  ASSERT_EQ(s.rejected.size(), 1u);
  EXPECT_EQ(s.rejected[0].key, "big-before");
  EXPECT_EQ(x.w->entries().at("big-after").value, "small now");
}

TEST(PrefixWatcherTest, FloodOfPutsEndsInTheRightBoundedSnapshot) {
  etcd_server etcd;
  recorded_watcher all(test_options(etcd.endpoint()));
  auto capped_options = test_options(etcd.endpoint());
  capped_options.max_keys = 1'000;
  recorded_watcher capped(capped_options);
  ASSERT_TRUE(all.connected() && capped.connected());

  // 10,000 puts over 5,000 keys from 4 threads (etcd batches concurrent writes).
  constexpr int puts = 10'000;
  constexpr int keys = 5'000;
  sluice::testing::kv_writer kv(etcd.endpoint());
  std::atomic<std::int64_t> highest{0};
  std::vector<std::thread> writers;
  for (int t = 0; t < 4; ++t) {
    writers.emplace_back([&, t] {
      for (int i = t; i < puts; i += 4) {
        std::string key = "/sluice/k";  // appended, not `"..." + s`: GCC 12 warns wrongly (-Wrestrict) on that
        key += std::to_string(i % keys);
        const auto rev = kv.put(key, std::to_string(i));
        for (auto h = highest.load(); rev > h && !highest.compare_exchange_weak(h, rev);) {
        }
      }
    });
  }
  for (auto& t : writers) t.join();
  const std::int64_t last = highest.load();
  ASSERT_TRUE(all.at(last)) << all.w->status().revision;
  ASSERT_TRUE(capped.at(last));

  // The watcher holds what etcd holds, value and revisions alike.
  const auto got = all.w->entries();
  ASSERT_EQ(got.size(), static_cast<std::size_t>(keys));
  recorded_watcher fresh(test_options(etcd.endpoint()));  // a full read of the same store
  ASSERT_TRUE(fresh.connected());
  EXPECT_EQ(fresh.w->entries(), got);
  EXPECT_TRUE(sluice::testing::revisions_increase(all.rec.deliveries()));
  EXPECT_EQ(sluice::testing::events_in(all.rec.deliveries()), static_cast<std::size_t>(puts));

  // At the key cap: the first 1,000 keys created, the rest left out and counted once per put.
  const auto s = capped.w->status();
  EXPECT_EQ(capped.w->entries().size(), 1'000u);
  EXPECT_EQ(s.rejected.size(), max_rejected_listed);
  EXPECT_EQ(s.rejected_total, static_cast<std::uint64_t>(puts - 2 * 1'000));  // each key is put twice
  for (const auto& [key, e] : capped.w->entries()) EXPECT_EQ(e, got.at(key));
}

// A watcher ends within well under a second, whatever it is doing.
std::chrono::steady_clock::duration time_to_destroy(recorded_watcher& x) {
  const auto start = std::chrono::steady_clock::now();
  x.w.reset();
  return std::chrono::steady_clock::now() - start;
}

TEST(PrefixWatcherTest, StopsPromptlyWhileWatching) {
  etcd_server etcd;
  recorded_watcher x(test_options(etcd.endpoint()));
  ASSERT_TRUE(x.connected());
  EXPECT_LT(time_to_destroy(x), 500ms);
}

TEST(PrefixWatcherTest, StopsPromptlyWhileBackingOff) {
  etcd_server etcd;
  etcd.kill();  // nothing listens there now
  auto o = test_options(etcd.endpoint());
  o.backoff_base = o.backoff_cap = 60s;
  recorded_watcher x(o);
  ASSERT_TRUE(x.failed());
  EXPECT_LT(time_to_destroy(x), 500ms);
}

TEST(PrefixWatcherTest, StopsPromptlyWhileConnecting) {
  // A socket that listens but never answers: the connection stays in its HTTP/2 handshake.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  auto o = test_options("127.0.0.1:" + std::to_string(ntohs(a.sin_port)));
  o.dial_timeout = 60s;
  recorded_watcher x(o);
  std::this_thread::sleep_for(300ms);  // into the connection attempt (not an assertion's wait)
  EXPECT_FALSE(x.w->status().connected);
  EXPECT_LT(time_to_destroy(x), 500ms);
  ::close(fd);
}

}  // namespace
}  // namespace sluice::etcd
