// SPDX-License-Identifier: Apache-2.0
#include "core/published.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

namespace sluice {
namespace {

TEST(Published, AViewSeesEachPublishAndKeepsWhatItReadUntilItReadsAgain) {
  published<int> p(std::make_shared<const int>(1));
  published<int>::view v;
  EXPECT_EQ(*p.read(v), 1);
  std::shared_ptr<const int> held = p.read(v);
  std::weak_ptr<const int> first = p.load();
  p.publish(std::make_shared<const int>(2));
  EXPECT_EQ(*held, 1) << "a value read stays valid";
  EXPECT_FALSE(first.expired()) << "the view still holds what it read";
  EXPECT_EQ(*p.read(v), 2);
  EXPECT_EQ(*p.load(), 2);
  held.reset();
  EXPECT_TRUE(first.expired()) << "the view let go of it at its next read";
}

TEST(Published, OneViewReadFromTwoHoldersReadsEachOnesValue) {
  published<int> a(std::make_shared<const int>(1));
  published<int> b(std::make_shared<const int>(2));
  published<int>::view v;  // a thread_local view serves every holder a thread reads
  EXPECT_EQ(*a.read(v), 1);
  EXPECT_EQ(*b.read(v), 2) << "same version number, another holder";
  EXPECT_EQ(*a.read(v), 1);
}

// Readers on other threads while one publishes: every read is a value published, never torn, and
// once the last publish is made each reader sees it (TSan checks the hand-over).
TEST(Published, ReadersOnOtherThreadsSeeWholeValues) {
  published<std::vector<int>> p(std::make_shared<const std::vector<int>>(100, 0));
  std::atomic<bool> done{false};
  std::atomic<int> torn{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 2; ++t) {
    readers.emplace_back([&] {
      published<std::vector<int>>::view v;
      while (!done.load(std::memory_order_acquire)) {
        const std::vector<int>& now = *p.read(v);
        for (int x : now) torn.fetch_add(x != now.front() ? 1 : 0, std::memory_order_relaxed);
      }
      if (p.read(v)->front() != 500) torn.fetch_add(1);
    });
  }
  for (int i = 1; i <= 500; ++i) p.publish(std::make_shared<const std::vector<int>>(100, i));
  done.store(true, std::memory_order_release);
  for (auto& r : readers) r.join();
  EXPECT_EQ(torn.load(), 0);
}

}  // namespace
}  // namespace sluice
