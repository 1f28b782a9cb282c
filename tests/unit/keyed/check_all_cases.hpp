// SPDX-License-Identifier: Apache-2.0
// What backend::check_all promises, checked on any backend (the memory backend's unit test and the
// Redis backend's integration test run the same cases): all or nothing, a refusal consumes nothing,
// a cost no wait admits is refused and records nothing, bad calls are refused whole.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <string>
#include <vector>

#include "sluice/backend.hpp"
#include "sluice/testing/simulated_clock.hpp"

namespace sluice::testing {

// `b` reads time from `clock`; nothing else uses the rules "all_fw" and "all_tb".
inline void expect_check_all_semantics(backend& b, simulated_clock& clock) {
  using namespace std::chrono_literals;
  const rule window{.name = "all_fw", .limit = fixed_window_policy(2, 60s)};
  const rule bucket{.name = "all_tb", .limit = token_bucket_policy(per_second(0.001), 3)};
  auto fw = b.prepare(window).value();
  auto tb = b.prepare(bucket).value();
  auto both = [&](std::int64_t window_cost, std::int64_t bucket_cost) {
    std::vector<check_request> checks{{.rule = fw.get(), .key = "k", .cost = window_cost},
                                      {.rule = tb.get(), .key = "k", .cost = bucket_cost}};
    return b.check_all(checks);
  };
  auto spare = b.prepare({.name = "all_spare", .limit = fixed_window_policy(1, 60s)}).value();
  auto remaining_of = [&](const rule& r, const prepared_rule& p) {
    // A look that changes nothing: a cost no wait admits, beside a key of its own.
    std::vector<check_request> look{{.rule = &p, .key = "k", .cost = r.limit.capacity() + 1},
                                    {.rule = spare.get(), .key = "look"}};
    return b.check_all(look).value()[0].remaining;
  };

  // Both admit: both record, each decision as its key stands after.
  auto first = both(1, 1).value();
  ASSERT_EQ(first.size(), 2u);
  EXPECT_TRUE(first[0].allowed);
  EXPECT_EQ(first[0].remaining, 1);
  EXPECT_EQ(first[0].limit, 2);
  EXPECT_TRUE(first[1].allowed);
  EXPECT_EQ(first[1].remaining, 2);
  EXPECT_EQ(first[1].limit, 3);

  // The window refuses: the bucket would have admitted, records nothing, and says what it holds.
  clock.advance(1ms);
  auto refused = both(2, 1).value();
  EXPECT_FALSE(refused[0].allowed);
  EXPECT_EQ(refused[0].remaining, 1);
  EXPECT_GT(refused[0].retry_after, 0ns);
  EXPECT_TRUE(refused[1].allowed) << "it alone would admit";
  EXPECT_EQ(refused[1].remaining, 2) << "and it kept its tokens";
  EXPECT_EQ(remaining_of(bucket, *tb), 2);
  EXPECT_EQ(remaining_of(window, *fw), 1);

  // A cost above the bucket's burst: refused for ever, and the window (which would admit) keeps its unit.
  auto never_admitted = both(1, 4).value();
  EXPECT_FALSE(never_admitted[1].allowed);
  EXPECT_EQ(never_admitted[1].retry_after, never);
  EXPECT_EQ(never_admitted[1].remaining, 2);
  EXPECT_TRUE(never_admitted[0].allowed);
  EXPECT_EQ(never_admitted[0].remaining, 1);
  EXPECT_EQ(remaining_of(window, *fw), 1);

  // Both admit again, to the window's last unit.
  auto last = both(1, 2).value();
  EXPECT_TRUE(last[0].allowed && last[1].allowed);
  EXPECT_EQ(last[0].remaining, 0);
  EXPECT_EQ(last[1].remaining, 0);

  // Bad calls are refused whole, and change nothing.
  clock.advance(60s);  // a new window: the window key has 2 again
  std::vector<check_request> twice{{.rule = fw.get(), .key = "k"}, {.rule = fw.get(), .key = "k"}};
  EXPECT_EQ(b.check_all(twice).error(), errc::invalid_argument);
  auto dual =
      b.prepare({.name = "all_dual", .limit = fixed_window_policy(1, 60s), .tenant = fixed_window_policy(1, 60s)})
          .value();
  std::vector<check_request> with_dual{{.rule = fw.get(), .key = "k"},
                                       {.rule = dual.get(), .tenant = "t", .user = "u"}};
  EXPECT_EQ(b.check_all(with_dual).error(), errc::invalid_argument);
  EXPECT_EQ(b.check_all({}).error(), errc::invalid_argument);
  std::vector<std::string> keys(max_checks_per_call + 1);
  std::vector<check_request> too_many;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    keys[i] = "many" + std::to_string(i);
    too_many.push_back({.rule = fw.get(), .key = keys[i]});
  }
  EXPECT_EQ(b.check_all(too_many).error(), errc::invalid_argument);
  std::vector<check_request> empty_key{{.rule = fw.get(), .key = "k"}, {.rule = tb.get(), .key = ""}};
  EXPECT_EQ(b.check_all(empty_key).error(), errc::invalid_argument);
  std::vector<check_request> no_rule{{.rule = fw.get(), .key = "k"}, {.rule = nullptr, .key = "k"}};
  EXPECT_EQ(b.check_all(no_rule).error(), errc::invalid_argument);
  EXPECT_EQ(remaining_of(window, *fw), 2);

  // The same key under two rules is two keys.
  std::vector<check_request> other{{.rule = fw.get(), .key = "other"}, {.rule = tb.get(), .key = "other"}};
  auto u = b.check_all(other).value();
  EXPECT_TRUE(u[0].allowed && u[1].allowed);
  EXPECT_EQ(u[0].remaining, 1);
  EXPECT_EQ(u[1].remaining, 2);

  // One check alone decides as that check, but a cost no wait admits is a refusal, not an error,
  // and takes nothing.
  std::vector<check_request> alone{{.rule = tb.get(), .key = "alone", .cost = 4}};
  auto over = b.check_all(alone).value();
  EXPECT_FALSE(over[0].allowed);
  EXPECT_EQ(over[0].retry_after, never);
  EXPECT_EQ(over[0].remaining, 3);
  alone[0].cost = 1;
  auto admitted = b.check_all(alone).value();
  EXPECT_TRUE(admitted[0].allowed);
  EXPECT_EQ(admitted[0].remaining, 2);
  EXPECT_EQ(admitted[0].limit, 3);
  EXPECT_EQ(b.check_all(alone).value()[0].remaining, 1) << "the admitted check was recorded";

  // Asynchronously, the same.
  std::vector<check_request> async{{.rule = fw.get(), .key = "async"}};
  std::promise<result<std::vector<decision>>> done;
  b.async_check_all(async, [&](result<std::vector<decision>> r) { done.set_value(std::move(r)); });
  auto a = done.get_future().get().value();
  EXPECT_TRUE(a[0].allowed);
  EXPECT_EQ(a[0].remaining, 1);
}

}  // namespace sluice::testing
