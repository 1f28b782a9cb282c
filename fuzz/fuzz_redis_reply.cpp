// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: what a broken or hostile Redis could answer a script call, read by hiredis's
// reader as the backend's connections read it (arrays bounded), then by every parser of script
// replies (command.hpp). Any reply must give a decision or an errc::backend_protocol error: no
// crash, no UB, bounded memory.
//
// The first byte picks the checks a batch reply answers (its bits: which of the prepared rules,
// up to eight checks); the rest is RESP.
#include <hiredis/hiredis.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "redis/command.hpp"
#include "sluice/policy.hpp"

namespace {

using namespace std::chrono_literals;
using sluice::detail::prepared_script;

// One rule of each algorithm, a dual-layer one and a leased one, prepared as the backend does.
const std::vector<prepared_script>& prepared() {
  static const std::vector<prepared_script> all = [] {
    const std::vector<sluice::rule> rules = {
        {.name = "tb", .limit = sluice::token_bucket_policy(sluice::per_second(5), 60)},
        {.name = "log", .limit = sluice::sliding_window_policy(100, 60s)},
        {.name = "counter", .limit = sluice::sliding_window_counter_policy(100, 60s)},
        {.name = "fixed", .limit = sluice::fixed_window_policy(3, 1min)},
        {.name = "dual",
         .limit = sluice::sliding_window_policy(3, 1min),
         .tenant = sluice::fixed_window_policy(10, 1min)},
        {.name = "leased",
         .limit = sluice::token_bucket_policy(sluice::per_second(50), 100),
         .lease = sluice::lease_policy{}},
    };
    std::vector<prepared_script> out;
    for (const auto& r : rules) {
      auto p = sluice::detail::prepare_script(r);
      if (!p) std::abort();
      out.push_back(std::move(*p));
    }
    return out;
  }();
  return all;
}

void parse_all(const redisReply& r, std::uint8_t pick) {
  const auto& rules = prepared();
  for (const auto& p : rules) (void)sluice::detail::parse_reply(p, r);
  std::vector<const prepared_script*> checks;
  for (int bit = 0; bit < 8; ++bit) {
    if (pick & (1u << bit)) checks.push_back(&rules[static_cast<std::size_t>(bit) % rules.size()]);
  }
  (void)sluice::detail::parse_batch_reply(checks, r);
  (void)sluice::detail::parse_lease_reply(rules.back(), false, 1, 5, r);
  (void)sluice::detail::parse_lease_reply(rules.back(), true, 0, 5, r);
  (void)sluice::detail::reply_time(r);
  (void)sluice::detail::is_expired_reply(r);
  (void)sluice::detail::parse_time_reply(r);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  redisReader* reader = redisReaderCreate();
  if (reader == nullptr) return 0;
  sluice::detail::reply_budget budget;
  sluice::detail::bound_replies(*reader, budget);  // as every connection's reader
  if (redisReaderFeed(reader, reinterpret_cast<const char*>(data) + 1, size - 1) == REDIS_OK) {
    void* reply = nullptr;
    // A few replies at most: the input bounds them anyway, and one is what a call gets.
    for (int n = 0; n < 16 && redisReaderGetReply(reader, &reply) == REDIS_OK && reply != nullptr; ++n) {
      parse_all(*static_cast<redisReply*>(reply), data[0]);
      freeReplyObject(reply);
      reply = nullptr;
    }
  }
  redisReaderFree(reader);
  return 0;
}
