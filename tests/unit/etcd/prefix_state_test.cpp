// SPDX-License-Identifier: Apache-2.0
#include "etcd/prefix_state.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace sluice::etcd::detail {
namespace {

change put(std::string_view key, std::string_view value, std::int64_t rev, std::int64_t created = 0) {
  return {.kind = change::type::put,
          .key = key,
          .value = value,
          .create_revision = created ? created : rev,
          .mod_revision = rev};
}
change erase(std::string_view key, std::int64_t rev) {
  return {.kind = change::type::erase, .key = key, .mod_revision = rev};
}

prefix_state make(state_limits limits = {.max_keys = 100, .max_value_bytes = 16, .max_key_bytes = 64}) {
  return prefix_state("/p/", limits);
}

TEST(PrefixStateTest, HoldsKeysWithoutThePrefixAndIgnoresOthers) {
  auto s = make();
  s.load(put("/p/a", "1", 3));
  s.load(put("/p/", "the prefix", 4));
  s.load(put("/q/a", "not ours", 5));
  s.set_revision(9);
  const snapshot want = {{"", {.value = "the prefix", .create_revision = 4, .mod_revision = 4}},
                         {"a", {.value = "1", .create_revision = 3, .mod_revision = 3}}};
  EXPECT_EQ(s.entries(), want);
  EXPECT_EQ(s.revision(), 9);
}

TEST(PrefixStateTest, EventsAtOrBeforeTheRevisionAreNotAppliedAgain) {
  auto s = make();
  s.load(put("/p/a", "1", 5));
  s.set_revision(7);
  const std::vector<change> replayed = {put("/p/a", "old", 6), erase("/p/a", 7)};
  EXPECT_EQ(s.apply(replayed), 0u);
  EXPECT_EQ(s.entries().at("a").value, "1");
  const std::vector<change> next = {put("/p/a", "2", 8, 5)};
  EXPECT_EQ(s.apply(next), 1u);
  EXPECT_EQ(s.entries().at("a"), (entry{.value = "2", .create_revision = 5, .mod_revision = 8}));
  EXPECT_EQ(s.revision(), 8);
}

TEST(PrefixStateTest, EveryEventOfOneRevisionIsApplied) {
  auto s = make();
  s.set_revision(3);
  const std::vector<change> txn = {put("/p/a", "1", 4), put("/p/b", "2", 4), erase("/p/c", 4)};
  EXPECT_EQ(s.apply(txn), 3u);
  EXPECT_EQ(s.entries().size(), 2u);
  EXPECT_EQ(s.revision(), 4);
}

TEST(PrefixStateTest, OverSizeValueIsLeftOutAndItsOldValueDropped) {
  auto s = make();
  s.load(put("/p/a", "small", 2));
  s.set_revision(2);
  const std::string big(17, 'x');
  EXPECT_EQ(s.apply(std::vector{put("/p/a", big, 3)}), 1u);
  EXPECT_TRUE(s.entries().empty());
  EXPECT_EQ(s.rejected_total(), 1u);
  ASSERT_EQ(s.rejected().size(), 1u);
  EXPECT_EQ(s.rejected()[0],
            (rejected_key{.key = "a", .mod_revision = 3, .reason = "value of 17 bytes is over max_value_bytes (16)"}));
  EXPECT_EQ(s.revision(), 3);

  const auto generation = s.rejected_generation();
  EXPECT_EQ(s.apply(std::vector{put("/p/a", "small again", 4, 2)}), 1u);
  EXPECT_EQ(s.entries().at("a").value, "small again");
  EXPECT_TRUE(s.rejected().empty());
  EXPECT_NE(s.rejected_generation(), generation);
  EXPECT_EQ(s.rejected_total(), 1u);
}

TEST(PrefixStateTest, OverLongKeyIsLeftOutAndListedByItsFirstBytes) {
  auto s = make({.max_keys = 10, .max_value_bytes = 16, .max_key_bytes = 1000});
  const std::string key = "/p/" + std::string(1000, 'k');
  s.load(put(key, "1", 2));
  EXPECT_TRUE(s.entries().empty());
  ASSERT_EQ(s.rejected().size(), 1u);
  EXPECT_EQ(s.rejected()[0].key, std::string(256, 'k'));
  EXPECT_EQ(s.rejected()[0].reason, "key of 1003 bytes is over max_key_bytes (1000)");
  EXPECT_EQ(s.rejected()[0].mod_revision, 2);
  s.set_revision(2);
  EXPECT_EQ(s.apply(std::vector{erase(key, 3)}), 1u);  // deleted: off the list
  EXPECT_TRUE(s.rejected().empty());
}

TEST(PrefixStateTest, ARejectedVersionIsListedWithItsWholeKeyAndRevision) {
  // A reader keeps its previous version of the key: it must know which key, and which version.
  auto s = make({.max_keys = 10, .max_value_bytes = 16, .max_key_bytes = 1000});
  const std::string name(400, 'n');
  s.set_revision(1);
  EXPECT_EQ(s.apply(std::vector{put("/p/" + name, std::string(17, 'x'), 2)}), 1u);
  EXPECT_EQ(s.apply(std::vector{put("/p/" + name, std::string(18, 'x'), 3, 2)}), 1u);
  ASSERT_EQ(s.rejected().size(), 1u);
  EXPECT_EQ(s.rejected()[0],
            (rejected_key{.key = name, .mod_revision = 3, .reason = "value of 18 bytes is over max_value_bytes (16)"}));
  EXPECT_EQ(s.rejected_total(), 2u);
  EXPECT_EQ(s.apply(std::vector{erase("/p/" + name, 4)}), 1u);
  EXPECT_TRUE(s.rejected().empty());
}

TEST(PrefixStateTest, AtTheKeyCapNewKeysAreLeftOutAndOldOnesStillChange) {
  auto s = make({.max_keys = 2, .max_value_bytes = 16, .max_key_bytes = 64});
  s.load(put("/p/a", "1", 2));
  s.load(put("/p/b", "1", 3));
  s.load(put("/p/c", "1", 4));
  s.set_revision(4);
  EXPECT_EQ(s.entries().size(), 2u);
  ASSERT_EQ(s.rejected().size(), 1u);
  EXPECT_EQ(s.rejected()[0],
            (rejected_key{.key = "c", .mod_revision = 4, .reason = "the snapshot holds max_keys (2) keys"}));
  EXPECT_EQ(s.apply(std::vector{put("/p/a", "2", 5, 2), put("/p/d", "1", 5)}), 2u);
  EXPECT_EQ(s.entries().at("a").value, "2");
  EXPECT_EQ(s.entries().count("d"), 0u);
  EXPECT_EQ(s.rejected_total(), 2u);
  // A key deleted frees a place for the next new key; the ones left out stay out.
  EXPECT_EQ(s.apply(std::vector{erase("/p/b", 6), put("/p/e", "1", 7)}), 2u);
  EXPECT_EQ(s.entries().count("e"), 1u);
  EXPECT_EQ(s.entries().count("c"), 0u);
}

TEST(PrefixStateTest, TheListOfRejectedKeysIsBoundedAndTheCountIsNot) {
  auto s = make({.max_keys = 1, .max_value_bytes = 16, .max_key_bytes = 64});
  std::vector<std::string> keys;
  for (int i = 0; i < 300; ++i) keys.push_back("/p/k" + std::to_string(i));
  for (const auto& k : keys) s.load(put(k, "1", 2));
  EXPECT_EQ(s.entries().size(), 1u);
  EXPECT_EQ(s.rejected().size(), max_rejected_listed);
  EXPECT_EQ(s.rejected_total(), 299u);
}

TEST(PrefixStateTest, AFullReadReplacesTheKeysAndKeepsTheCount) {
  auto s = make();
  s.load(put("/p/a", std::string(20, 'x'), 2));
  s.load(put("/p/b", "1", 3));
  s.set_revision(3);
  auto fresh = make();
  fresh.load(put("/p/c", "1", 9));
  fresh.set_revision(10);
  s.replace_with(std::move(fresh));
  EXPECT_EQ(s.entries().size(), 1u);
  EXPECT_EQ(s.entries().count("c"), 1u);
  EXPECT_EQ(s.revision(), 10);
  EXPECT_TRUE(s.rejected().empty());
  EXPECT_EQ(s.rejected_total(), 1u);
}

TEST(PrefixStateTest, ProgressNeverGoesBack) {
  auto s = make();
  s.set_revision(10);
  s.advance_to(8);
  EXPECT_EQ(s.revision(), 10);
  s.advance_to(12);
  EXPECT_EQ(s.revision(), 12);
  EXPECT_EQ(s.apply(std::vector{put("/p/a", "1", 12)}), 0u);  // at or before the progress: not new
}

}  // namespace
}  // namespace sluice::etcd::detail
