// SPDX-License-Identifier: Apache-2.0
// What a check sends to Redis and how its reply is read, without a redis-server: argument vectors
// built from prepared rules and requests, and replies — good and hostile (wrong types, short and
// long arrays, huge and negative integers) — built by hand as hiredis would hand them over.
#include "redis/command.hpp"

#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <bit>
#include <charconv>
#include <chrono>
#include <deque>
#include <limits>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "redis/keys.hpp"
#include "unit/redis/reply_builder.hpp"
#include "redis/scripts.hpp"
#include "redis/slot.hpp"
#include "sluice/gcra.hpp"

namespace sluice::detail {
namespace {

using namespace std::chrono_literals;

// Decodes one RESP array of bulk strings (what a command is), failing the test on anything else.
std::vector<std::string> decode(std::string_view resp) {
  std::vector<std::string> args;
  auto number = [&](char lead) -> long long {
    EXPECT_FALSE(resp.empty());
    if (resp.empty() || resp[0] != lead) {
      ADD_FAILURE() << "expected '" << lead << "' at: " << resp.substr(0, 20);
      return -1;
    }
    const auto crlf = resp.find("\r\n");
    const long long n = std::stoll(std::string(resp.substr(1, crlf - 1)));
    resp.remove_prefix(crlf + 2);
    return n;
  };
  const long long argc = number('*');
  for (long long i = 0; i < argc; ++i) {
    const long long len = number('$');
    if (len < 0 || static_cast<std::size_t>(len) + 2 > resp.size()) {
      ADD_FAILURE() << "bad bulk length " << len;
      return args;
    }
    args.emplace_back(resp.substr(0, static_cast<std::size_t>(len)));
    EXPECT_EQ(resp.substr(static_cast<std::size_t>(len), 2), "\r\n");
    resp.remove_prefix(static_cast<std::size_t>(len) + 2);
  }
  EXPECT_TRUE(resp.empty()) << "trailing bytes: " << resp;
  return args;
}

constexpr long long now_us = 1'700'000'000'000'000;

// A number as scripts take it: hex digits (scripts.hpp).
std::string hex(long long v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v, 16);
  return std::string(buf, end);
}

prepared_script prepared(const rule& r) {
  auto p = prepare_script(r);
  EXPECT_TRUE(p.ok()) << p.error().message;
  return p.ok() ? std::move(p).value() : prepared_script{};
}

// --- prepare_script -----------------------------------------------------------------------------

TEST(PrepareScript, TokenBucketParametersAreIntegerNanoseconds) {
  const rule r{.name = "api", .limit = token_bucket_policy(per_second(1000), 10)};
  prepared_script p = prepared(r);
  EXPECT_EQ(p.script, single_script(algorithm::token_bucket));
  EXPECT_FALSE(p.dual);
  EXPECT_EQ(p.limit, 10);
  // interval 1 ms, tolerance burst × interval, burst.
  EXPECT_EQ(decode("*3\r\n" + p.params), (std::vector<std::string>{hex(1'000'000), hex(10'000'000), "a"}));
  const gcra_params g = make_gcra_params(per_second(5), 60);
  EXPECT_EQ(decode("*3\r\n" + prepared({.name = "b", .limit = token_bucket_policy(per_second(5), 60)}).params),
            (std::vector<std::string>{hex(g.interval_ns), hex(g.tolerance_ns), hex(60)}));
  // An infinite rate: interval 0.
  EXPECT_EQ(decode("*3\r\n" + prepared({.name = "i", .limit = token_bucket_policy(rate::infinite(), 3)}).params)[0],
            "0");
}

TEST(PrepareScript, WindowsAreWholeMicrosecondsRoundedUpAndCapped) {
  EXPECT_EQ(decode("*3\r\n" + prepared({.name = "w", .limit = sliding_window_policy(100, 60s)}).params),
            (std::vector<std::string>{hex(100), hex(60'000'000), "0"}));
  EXPECT_EQ(decode("*3\r\n" + prepared({.name = "w", .limit = fixed_window_policy(7, 1500ns)}).params)[1], "2");
  EXPECT_EQ(decode("*3\r\n" + prepared({.name = "w", .limit = fixed_window_policy(7, 1000ns)}).params)[1], "1");
  // Longer than 2^52 µs (~142 years) acts as 2^52 µs.
  const rule huge{.name = "w", .limit = sliding_window_counter_policy(7, nanoseconds::max())};
  EXPECT_EQ(decode("*3\r\n" + prepared(huge).params)[1], hex(std::int64_t{1} << 52));
  prepared_script p = prepared({.name = "w", .limit = sliding_window_counter_policy(7, 1s)});
  EXPECT_EQ(p.script, single_script(algorithm::sliding_window_counter));
  EXPECT_EQ(p.limit, 7);
}

TEST(PrepareScript, DualLayerSendsTheTenantFirst) {
  const rule r{
      .name = "d", .limit = sliding_window_policy(3, 1min), .tenant = token_bucket_policy(per_second(1000), 6)};
  prepared_script p = prepared(r);
  EXPECT_TRUE(p.dual);
  EXPECT_EQ(p.script, dual_script(algorithm::token_bucket, algorithm::sliding_window_log));
  EXPECT_EQ(p.limit, 3);
  EXPECT_EQ(p.tenant_limit, 6);
  EXPECT_EQ(decode("*6\r\n" + p.params),
            (std::vector<std::string>{hex(1'000'000), hex(6'000'000), "6", "3", hex(60'000'000), "0"}));
}

TEST(PrepareScript, RefusesWhatItCannotComputeExactly) {
  struct bad_case {
    rule r;
    const char* message;
  };
  const bad_case cases[] = {
      {{.name = "zero", .limit = sliding_window_policy(0, 1s)}, "limit must be > 0"},
      {{.name = "fast", .limit = token_bucket_policy(per_second(2e6), 10)}, "rule 'fast': rate 2000000 per second"},
      {{.name = "big", .limit = fixed_window_policy((std::int64_t{1} << 53) + 1, 1s)},
       "rule 'big': limit 9007199254740993"},
      {{.name = "deep", .limit = token_bucket_policy(per_second(1), (std::int64_t{1} << 53) + 1)},
       "rule 'deep': burst"},
      {{.name = "t",
        .limit = sliding_window_policy(1, 1s),
        .tenant = sliding_window_policy((std::int64_t{1} << 53) + 1, 1s)},
       "rule 't' tenant layer: limit"},
  };
  for (const bad_case& c : cases) {
    auto p = prepare_script(c.r);
    ASSERT_FALSE(p.ok()) << c.r.name;
    EXPECT_EQ(p.error(), errc::invalid_argument) << c.r.name;
    EXPECT_NE(p.error().message.find(c.message), std::string::npos) << p.error().message;
  }
  // The largest exact values pass.
  EXPECT_TRUE(
      prepare_script({.name = "ok", .limit = token_bucket_policy(per_second(1e6), std::int64_t{1} << 53)}).ok());
}

// --- evalsha_command, eval_command ----------------------------------------------------------------

TEST(EvalshaCommand, SingleLayerArguments) {
  const rule r{.name = "api", .limit = sliding_window_policy(100, 60s)};
  prepared_script p = prepared(r);
  command c = evalsha_command(p, r, {.key = "user:42", .cost = 3}, "app:", -1, 123456);
  const auto& s = scripts()[p.script];
  EXPECT_EQ(decode(c.text),
            (std::vector<std::string>{"EVALSHA", s.sha1, "1", single_key("app:", "api", "user:42", "swl.60000000"), "-",
                                      "3", hex(100), hex(60'000'000), "0", "000000000001e240"}));
  EXPECT_EQ(c.text.substr(0, c.header), "*10\r\n");
  EXPECT_EQ(c.text.substr(c.rest, 7), "$1\r\n1\r\n");  // numkeys: where EVAL's form continues
  // A test clock's `now`, no deadline.
  command t = evalsha_command(p, r, {.key = "k"}, "sluice:", now_us, -1);
  const auto args = decode(t.text);
  EXPECT_EQ(args[4], hex(now_us));
  EXPECT_EQ(args[9], "ffffffffffffffff");  // later than any time
  // The keys' slot, for a cluster.
  EXPECT_EQ(c.slot, key_slot(single_key("app:", "api", "user:42", "swl.60000000")));
}

TEST(EvalshaCommand, SetDeadlineRewritesTheFixedWidthField) {
  const rule r{.name = "api", .limit = fixed_window_policy(3, 1min)};
  command c = evalsha_command(prepared(r), r, {.key = "k"}, "sluice:", -1, -1);
  const std::size_t size = c.text.size();
  set_deadline(c, 1'700'000'000'123'456);
  EXPECT_EQ(decode(c.text).back(), "000" + hex(1'700'000'000'123'456));
  set_deadline(c, -1);
  EXPECT_EQ(decode(c.text).back(), "ffffffffffffffff");
  set_deadline(c, 0);
  EXPECT_EQ(decode(c.text).back(), "0000000000000000");
  set_deadline(c, std::numeric_limits<std::int64_t>::max());  // fits the field
  EXPECT_EQ(decode(c.text).back(), "7fffffffffffffff");
  EXPECT_EQ(c.text.size(), size);
}

TEST(EvalshaCommand, DualLayerArguments) {
  const rule r{.name = "d", .limit = fixed_window_policy(3, 1min), .tenant = fixed_window_policy(10, 1min)};
  prepared_script p = prepared(r);
  command c = evalsha_command(p, r, {.tenant = "acme", .user = "bob"}, "sluice:", -1, -1);
  EXPECT_EQ(decode(c.text),
            (std::vector<std::string>{"EVALSHA", scripts()[p.script].sha1, "2",
                                      tenant_key("sluice:", "d", "acme", "fw2.60000000"),
                                      user_key("sluice:", "d", "acme", "bob", "fw2.60000000"), "-", "1", "a",
                                      hex(60'000'000), "0", "3", hex(60'000'000), "0", "ffffffffffffffff"}));
  EXPECT_EQ(c.text.substr(0, c.header), "*14\r\n");
  EXPECT_EQ(c.slot, key_slot("acme"));  // both keys carry the tenant's hash tag
}

TEST(EvalshaCommand, HostileIdsStayOneArgument) {
  const rule r{.name = "api", .limit = fixed_window_policy(3, 1min)};
  const std::string id("a\r\n$5\r\n*1\r\n\0}{:%", 16);
  command c = evalsha_command(prepared(r), r, {.key = id}, "sluice:", -1, -1);
  const auto args = decode(c.text);
  ASSERT_EQ(args.size(), 10u);
  EXPECT_EQ(args[3], single_key("sluice:", "api", id, "fw2.60000000"));
}

TEST(EvalCommand, SendsTheBodyInPlaceOfTheHash) {
  const rule r{.name = "api", .limit = token_bucket_policy(per_second(5), 60)};
  prepared_script p = prepared(r);
  command c = evalsha_command(p, r, {.key = "k", .cost = 2}, "sluice:", -1, 99);
  auto sha = decode(c.text);
  auto eval = decode(eval_command(c, scripts()[p.script].body));
  ASSERT_EQ(eval.size(), sha.size());
  EXPECT_EQ(eval[0], "EVAL");
  EXPECT_EQ(eval[1], scripts()[p.script].body);
  EXPECT_EQ(std::vector<std::string>(eval.begin() + 2, eval.end()),
            std::vector<std::string>(sha.begin() + 2, sha.end()));
}

TEST(OomProbeCommand, EvalOfAWritingScriptThatWritesNothing) {
  EXPECT_EQ(decode(oom_probe_command()), (std::vector<std::string>{"EVAL", "#!lua\nreturn 1", "0"}));
}

// --- parse_reply ----------------------------------------------------------------------------------

const rule single_rule{.name = "s", .limit = token_bucket_policy(per_second(5), 60)};
const rule dual_rule{.name = "d", .limit = sliding_window_policy(3, 1min), .tenant = sliding_window_policy(10, 1min)};

TEST(ParseReply, AdmittedAndRefused) {
  replies b;
  prepared_script p = prepared(single_rule);
  auto ok = parse_reply(p, *b.integers({1, 59, 0, 200'000, now_us}));
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_TRUE(ok->allowed);
  EXPECT_EQ(ok->limit, 60);
  EXPECT_EQ(ok->remaining, 59);
  EXPECT_EQ(ok->retry_after, 0ns);
  EXPECT_EQ(ok->reset_after, 200ms);
  auto no = parse_reply(p, *b.integers({0, 0, 200'000, 12'000'000, now_us}));
  ASSERT_TRUE(no.ok());
  EXPECT_FALSE(no->allowed);
  EXPECT_EQ(no->remaining, 0);
  EXPECT_EQ(no->retry_after, 200ms);
  EXPECT_EQ(no->reset_after, 12s);
  // An admitted check has no retry_after, whatever the script says.
  EXPECT_EQ(parse_reply(p, *b.integers({1, 0, 5'000, 0, now_us}))->retry_after, 0ns);
}

TEST(ParseReply, DualLayerCombinesAsInProcess) {
  replies b;
  prepared_script p = prepared(dual_rule);
  auto d = parse_reply(p, *b.integers({1, 9, 0, 60'000'000, 0, 0, 20'000'000, 60'000'000, now_us}));
  ASSERT_TRUE(d.ok()) << d.error().message;
  decision tenant{.allowed = true, .limit = 10, .remaining = 9, .retry_after = 0ns, .reset_after = 60s};
  decision user{.allowed = false, .limit = 3, .remaining = 0, .retry_after = 20s, .reset_after = 60s};
  const decision expected = combine_layers(tenant, user);
  EXPECT_EQ(d->allowed, expected.allowed);
  EXPECT_FALSE(d->allowed);
  EXPECT_EQ(d->rejected_by, expected.rejected_by);
  EXPECT_EQ(d->limit, expected.limit);
  EXPECT_EQ(d->remaining, expected.remaining);
  EXPECT_EQ(d->retry_after, expected.retry_after);
  EXPECT_EQ(d->reset_after, expected.reset_after);
  EXPECT_EQ(d->tenant.limit, 10);
  EXPECT_EQ(d->user.limit, 3);
  EXPECT_TRUE(d->dual_layer);
}

TEST(ParseReply, HostileShapesAreProtocolErrors) {
  replies b;
  prepared_script single = prepared(single_rule);
  prepared_script dual = prepared(dual_rule);
  const std::vector<redisReply*> bad_single = {
      b.integer(1),                                                                            // not an array
      b.string("1 59 0 0 0"),                                                                  // a string
      b.string("ERR boom", REDIS_REPLY_ERROR),                                                 // an error
      b.string("OK", REDIS_REPLY_STATUS),                                                      // a status
      b.nil(),                                                                                 // nil
      b.array({}),                                                                             // empty
      b.integers({1, 59, 0, 200'000}),                                                         // short: no time
      b.integers({1, 59, 0, 200'000, now_us, 7}),                                              // long
      b.integers({-1, now_us}),                                                                // the expired reply
      b.integers({2, 59, 0, 0, now_us}),                                                       // allowed is not 0 or 1
      b.integers({-1, 59, 0, 0, now_us}),                                                      //
      b.integers({std::numeric_limits<long long>::max(), 1, 1, 1, now_us}),                    //
      b.array({b.integer(1), b.string("59"), b.integer(0), b.integer(0), b.integer(now_us)}),  // a string element
      b.array({b.integer(1), b.nil(), b.integer(0), b.integer(0), b.integer(now_us)}),         // a nil element
      b.array({b.integer(1), b.integers({59}), b.integer(0), b.integer(0), b.integer(now_us)}),  // nested
      b.integers({1, 9, 0, 0, 1, 2, 0, 0, now_us}),  // a dual reply to a single rule
  };
  for (std::size_t i = 0; i < bad_single.size(); ++i) {
    auto d = parse_reply(single, *bad_single[i]);
    ASSERT_FALSE(d.ok()) << "case " << i;
    EXPECT_EQ(d.error(), errc::backend_protocol) << "case " << i;
    EXPECT_EQ(d.error().message, "unexpected reply from the rate-limit script") << "case " << i;
  }
  const std::vector<redisReply*> bad_dual = {
      b.integers({1, 59, 0, 200'000, now_us}),        // a single reply to a dual rule
      b.integers({1, 9, 0, 0, 1, 2, 0, 0}),           // short
      b.integers({3, 9, 0, 0, 1, 2, 0, 0, now_us}),   // tenant allowed not 0 or 1
      b.integers({1, 9, 0, 0, -1, 2, 0, 0, now_us}),  // user allowed not 0 or 1
      b.array({b.integer(1), b.integer(9), b.integer(0), b.integer(0), b.string("1"), b.integer(2), b.integer(0),
               b.integer(0), b.integer(now_us)}),
      b.integer(0),
  };
  for (std::size_t i = 0; i < bad_dual.size(); ++i) {
    auto d = parse_reply(dual, *bad_dual[i]);
    ASSERT_FALSE(d.ok()) << "case " << i;
    EXPECT_EQ(d.error(), errc::backend_protocol) << "case " << i;
    EXPECT_EQ(d.error().message, "unexpected reply from the dual-layer script") << "case " << i;
  }
}

// Numbers a script should never send still give a decision that cannot be read as more lenient
// than "never": negative counts are 0, negative or overlong durations are `never`.
TEST(ParseReply, HugeAndNegativeValues) {
  replies b;
  prepared_script p = prepared(single_rule);
  constexpr long long max = std::numeric_limits<long long>::max();
  constexpr long long min = std::numeric_limits<long long>::min();
  auto negative = parse_reply(p, *b.integers({0, -5, -1, -1, now_us}));
  ASSERT_TRUE(negative.ok());
  EXPECT_EQ(negative->remaining, 0);
  EXPECT_EQ(negative->retry_after, never);  // -1: "never", as the scripts say for a bucket that cannot refill
  EXPECT_EQ(negative->reset_after, never);
  auto lowest = parse_reply(p, *b.integers({0, min, min, min, now_us}));
  ASSERT_TRUE(lowest.ok());
  EXPECT_EQ(lowest->remaining, 0);
  EXPECT_EQ(lowest->retry_after, never);
  EXPECT_EQ(lowest->reset_after, never);
  // µs beyond what ns can hold are `never`, not an overflow.
  auto huge = parse_reply(p, *b.integers({0, max, max, max, now_us}));
  ASSERT_TRUE(huge.ok());
  EXPECT_EQ(huge->remaining, max);
  EXPECT_EQ(huge->retry_after, never);
  EXPECT_EQ(huge->reset_after, never);
  const long long edge = max / 1000;
  auto at_edge = parse_reply(p, *b.integers({0, 1, edge, edge + 1, now_us}));
  ASSERT_TRUE(at_edge.ok());
  EXPECT_EQ(at_edge->retry_after, nanoseconds(edge * 1000));
  EXPECT_EQ(at_edge->reset_after, never);
  // The time the reply ends with does not enter the decision.
  EXPECT_TRUE(parse_reply(p, *b.integers({1, 1, 0, 0, -7})).ok());
  EXPECT_TRUE(parse_reply(p, *b.integers({1, 1, 0, 0, max})).ok());
}

// --- reply_time, is_expired_reply, parse_time_reply ---------------------------------------------

TEST(ReplyTime, TheLastIntegerWithinTwoToThe53) {
  replies b;
  EXPECT_EQ(reply_time(*b.integers({1, 59, 0, 0, now_us})), now_us);
  EXPECT_EQ(reply_time(*b.integers({-1, now_us})), now_us);
  EXPECT_EQ(reply_time(*b.integers({0})), 0);
  EXPECT_EQ(reply_time(*b.integers({1, (1LL << 53) - 1})), (1LL << 53) - 1);
  EXPECT_EQ(reply_time(*b.integers({1, 1LL << 53})), -1);
  EXPECT_EQ(reply_time(*b.integers({1, -1})), -1);
  EXPECT_EQ(reply_time(*b.integers({1, std::numeric_limits<long long>::min()})), -1);
  EXPECT_EQ(reply_time(*b.array({b.integer(1), b.string("1700000000000000")})), -1);
  EXPECT_EQ(reply_time(*b.array({})), -1);
  EXPECT_EQ(reply_time(*b.integer(now_us)), -1);
  EXPECT_EQ(reply_time(*b.nil()), -1);
}

TEST(IsExpiredReply, OnlyMinusOneAndTheTime) {
  replies b;
  EXPECT_TRUE(is_expired_reply(*b.integers({-1, now_us})));
  EXPECT_TRUE(is_expired_reply(*b.array({b.integer(-1), b.string("x")})));  // the time is read apart
  EXPECT_FALSE(is_expired_reply(*b.integers({-1})));
  EXPECT_FALSE(is_expired_reply(*b.integers({-1, now_us, 0})));
  EXPECT_FALSE(is_expired_reply(*b.integers({0, now_us})));
  EXPECT_FALSE(is_expired_reply(*b.array({b.string("-1"), b.integer(now_us)})));
  EXPECT_FALSE(is_expired_reply(*b.integers({1, 59, 0, 0, now_us})));
  EXPECT_FALSE(is_expired_reply(*b.integer(-1)));
}

TEST(ParseTimeReply, SecondsAndMicroseconds) {
  replies b;
  EXPECT_EQ(parse_time_reply(*b.array({b.string("1700000000"), b.string("123456")})), 1'700'000'000'123'456);
  EXPECT_EQ(parse_time_reply(*b.array({b.string("0"), b.string("0")})), 0);
  EXPECT_EQ(parse_time_reply(*b.array({b.string("1700000000"), b.string("999999")})), 1'700'000'000'999'999);
  const std::vector<redisReply*> bad = {
      b.array({b.string("1700000000")}),                                    // short
      b.array({b.string("1"), b.string("2"), b.string("3")}),               // long
      b.array({b.integer(1700000000), b.integer(5)}),                       // integers
      b.array({b.string("-1"), b.string("0")}),                             // negative seconds
      b.array({b.string("1"), b.string("-1")}),                             // negative µs
      b.array({b.string("1"), b.string("1000000")}),                        // µs of another second
      b.array({b.string("1"), b.string("9223372036854775807")}),            // would overflow
      b.array({b.string(std::to_string((1LL << 40) + 1)), b.string("0")}),  // beyond 2^40 s
      b.array({b.string("99999999999999999999"), b.string("0")}),           // out of range
      b.array({b.string("abc"), b.string("0")}),                            // not a number
      b.array({b.string(""), b.string("0")}),                               // empty
      b.string("1700000000 0"),
      b.nil(),
  };
  for (std::size_t i = 0; i < bad.size(); ++i) EXPECT_EQ(parse_time_reply(*bad[i]), -1) << "case " << i;
}

// What a hostile server's array header costs: hiredis allocates the elements when it reads it.
TEST(BoundReplyArrays, AnArrayOverTheBoundFailsTheReaderBeforeAllocating) {
  auto read = [](const std::string& resp, bool bounded) {
    redisReader* r = redisReaderCreate();
    reply_budget budget;
    if (bounded) bound_replies(*r, budget);
    void* reply = nullptr;
    redisReaderFeed(r, resp.data(), resp.size());
    const int status = redisReaderGetReply(r, &reply);
    const bool read_whole = status == REDIS_OK && reply != nullptr;
    std::size_t elements = read_whole ? static_cast<redisReply*>(reply)->elements : 0;
    if (reply) freeReplyObject(reply);
    redisReaderFree(r);
    return std::pair{status, elements};
  };
  auto header = [](long long elements) {
    std::string h = "*";
    h += std::to_string(elements);
    h += "\r\n";
    return h;
  };
  std::string longest = header(max_reply_array);
  for (int i = 0; i < max_reply_array; ++i) longest += ":1\r\n";
  EXPECT_EQ(read(longest, true), std::pair(REDIS_OK, static_cast<std::size_t>(max_reply_array)));
  EXPECT_EQ(read("*3\r\n:1\r\n*1\r\n$1\r\nx\r\n:3\r\n", true), std::pair(REDIS_OK, std::size_t{3}));
  // One more element, or two billion of them: an error, the reply never made.
  EXPECT_EQ(read(header(max_reply_array + 1), true).first, REDIS_ERR);
  EXPECT_EQ(read("*2000000000\r\n", true).first, REDIS_ERR);
  EXPECT_EQ(read("*2\r\n*2000000000\r\n", true).first, REDIS_ERR);  // nested too
  // Without the bound hiredis takes the header and waits for the elements.
  EXPECT_EQ(read(header(max_reply_array + 1), false), std::pair(REDIS_OK, std::size_t{0}));
}

// A reply's values and its strings' bytes are bounded in all, however they are spread over arrays;
// each reply starts a new count.
TEST(BoundReplies, AReplyHoldsAtMostMaxReplyValuesAndMaxReplyBytes) {
  auto read = [](const std::string& resp) {
    redisReader* r = redisReaderCreate();
    reply_budget budget;
    bound_replies(*r, budget);
    redisReaderFeed(r, resp.data(), resp.size());
    int whole = 0;
    void* reply = nullptr;
    while (redisReaderGetReply(r, &reply) == REDIS_OK && reply != nullptr) {
      ++whole;
      freeReplyObject(reply);
      reply = nullptr;
    }
    const bool failed = r->err != 0;
    redisReaderFree(r);
    return std::tuple{whole, failed, why_refused(budget)};
  };
  // Arrays of max_reply_array integers: 15 of them make 983,056 values, 16 make 1,048,593.
  std::string full = "*65536\r\n";
  for (int i = 0; i < max_reply_array; ++i) full += ":1\r\n";
  auto arrays = [&](int n) {
    std::string out = "*";
    out += std::to_string(n);
    out += "\r\n";
    for (int i = 0; i < n; ++i) out += full;
    return out;
  };
  EXPECT_EQ(read(arrays(15)), std::tuple(1, false, std::string()));
  EXPECT_EQ(read(arrays(16)), std::tuple(0, true, std::string("a reply held more than 1048576 values")));
  // Strings: 16,000,000 bytes in two fit, 18,000,000 do not; a second reply counts anew.
  auto strings = [](std::size_t each) {
    std::string out = "*2\r\n";
    for (int i = 0; i < 2; ++i) {
      out += "$";
      out += std::to_string(each);
      out += "\r\n";
      out.append(each, 'x');
      out += "\r\n";
    }
    return out;
  };
  EXPECT_EQ(read(strings(8'000'000) + strings(8'000'000)), std::tuple(2, false, std::string()));
  EXPECT_EQ(read(strings(9'000'000)),
            std::tuple(0, true, std::string("a reply's strings held more than 16777216 bytes")));
  EXPECT_EQ(read("*65537\r\n"),
            std::tuple(0, true, std::string("a reply held an array of 65537 elements, more than 65536")));
}

// A connection's reader makes one reply per command queued (budget.awaited): hiredis 0.14 asserts
// on a reply no command waits for, so the reader fails first. Each reply counts once, however it
// nests and whatever its type.
TEST(BoundReplies, AReplyNoCommandWaitsForFailsTheReader) {
  auto read = [](const std::string& resp, std::size_t awaited) {
    redisReader* r = redisReaderCreate();
    reply_budget budget{.awaited = awaited};
    bound_replies(*r, budget);
    redisReaderFeed(r, resp.data(), resp.size());
    int whole = 0;
    void* reply = nullptr;
    while (redisReaderGetReply(r, &reply) == REDIS_OK && reply != nullptr) {
      ++whole;
      freeReplyObject(reply);
      reply = nullptr;
    }
    const bool failed = r->err != 0;
    redisReaderFree(r);
    return std::tuple{whole, failed, why_refused(budget)};
  };
  const std::string unasked = "a reply came with no command waiting";
  // Pipelined: nested arrays, an empty and a nil array, a nil, a string, a status, an error, an integer.
  const std::string eight = "*2\r\n*1\r\n:1\r\n$-1\r\n*0\r\n*-1\r\n$-1\r\n$1\r\nx\r\n+OK\r\n-ERR no\r\n:5\r\n";
  EXPECT_EQ(read(eight, 8), std::tuple(8, false, std::string()));
  EXPECT_EQ(read(eight, 9), std::tuple(8, false, std::string()));  // one still waits
  EXPECT_EQ(read(eight, 7), std::tuple(7, true, unasked));
  EXPECT_EQ(read(eight + "+OK\r\n", 8), std::tuple(8, true, unasked));
  EXPECT_EQ(read("+OK\r\n", 0), std::tuple(0, true, unasked));
  EXPECT_EQ(read("-ERR max clients\r\n", 0), std::tuple(0, true, unasked));
  // A reader fed by hand counts nothing.
  EXPECT_EQ(read(eight, reply_budget{}.awaited), std::tuple(8, false, std::string()));
}

// What a connection asks after each read: the reply being read may be a long string on its way, but
// never a line that does not end.
TEST(OverlongReply, TheReplyBeingReadMayHoldALongStringButNoLongLine) {
  auto after_reading = [](const std::string& resp) {
    redisReader* r = redisReaderCreate();
    redisReaderFeed(r, resp.data(), resp.size());
    void* reply = nullptr;
    while (redisReaderGetReply(r, &reply) == REDIS_OK && reply != nullptr) {
      freeReplyObject(reply);
      reply = nullptr;
    }
    std::string why = overlong_reply(*r);
    redisReaderFree(r);
    return why;
  };
  const std::string line(max_reply_line, '1');
  const std::string too_long = "a reply's line ran past 65536 bytes";
  EXPECT_EQ(after_reading("+" + line), "");
  EXPECT_EQ(after_reading("+" + line + "a"), too_long);
  EXPECT_EQ(after_reading(":" + line + "1"), too_long);
  EXPECT_EQ(after_reading("*2\r\n:1\r\n$" + line + "1"), too_long);  // a string's length, in an array
  // A string whose length has been read may hold up to max_reply_bytes before it is whole.
  // (The reader has taken the type, '$'; the length line is held with the string.)
  const std::string length = "2000000000\r\n";
  EXPECT_EQ(after_reading("$" + length + std::string(max_reply_bytes - length.size(), 'x')), "");
  EXPECT_EQ(after_reading("$" + length + std::string(max_reply_bytes - length.size() + 1, 'x')),
            "a reply held 16777217 bytes before it was whole, more than 16777216");
  // Whole replies are taken first: what is held is the next one's.
  const std::string whole = "$100000\r\n" + std::string(100000, 'x') + "\r\n+OK\r\n";
  EXPECT_EQ(after_reading(whole + "+" + line), "");
  EXPECT_EQ(after_reading(whole + "+" + line + "a"), too_long);
}

}  // namespace
}  // namespace sluice::detail

namespace sluice::detail {
namespace {

// --- batch_builder, parse_batch_reply ------------------------------------------------------------

TEST(BatchBuilder, KeysThenNowAndDeadlineThenEachRulesParametersOnceThenEachChecksSetAndCost) {
  const rule one{.name = "api", .limit = fixed_window_policy(3, 1min)};
  const rule two{.name = "d", .limit = fixed_window_policy(3, 1min), .tenant = fixed_window_policy(10, 1min)};
  const prepared_script p1 = prepared(one);
  const prepared_script p2 = prepared(two);
  batch_builder b;
  b.add(evalsha_command(p1, one, {.key = "k", .cost = 2}, "sluice:", -1, -1), p1.script, 1);
  b.add(evalsha_command(p2, two, {.tenant = "acme", .user = "bob"}, "sluice:", -1, -1), p2.script, 2);
  b.add(evalsha_command(p1, one, {.key = "j"}, "sluice:", -1, -1), p1.script, 1);
  EXPECT_EQ(b.checks, 3u);
  EXPECT_EQ(decode(b.text(4242)), (std::vector<std::string>{"EVALSHA",
                                                            scripts()[batch_script].sha1,
                                                            "4",
                                                            single_key("sluice:", "api", "k", "fw2.60000000"),
                                                            tenant_key("sluice:", "d", "acme", "fw2.60000000"),
                                                            user_key("sluice:", "d", "acme", "bob", "fw2.60000000"),
                                                            single_key("sluice:", "api", "j", "fw2.60000000"),
                                                            "-",
                                                            "0000000000001092",
                                                            "2",  // parameter sets
                                                            hex(static_cast<long long>(p1.script)),
                                                            "3",
                                                            hex(60'000'000),
                                                            "0",
                                                            hex(static_cast<long long>(p2.script)),
                                                            "a",
                                                            hex(60'000'000),
                                                            "0",
                                                            "3",
                                                            hex(60'000'000),
                                                            "0",
                                                            "1",  // set, cost of each check
                                                            "2",
                                                            "2",
                                                            "1",
                                                            "1",
                                                            "1"}));
}

TEST(BatchBuilder, ADualLayerRulesSetIsSharedAndACheckAllGroupIsMarkedZero) {
  const rule dual{.name = "d", .limit = fixed_window_policy(3, 1min), .tenant = fixed_window_policy(10, 1min)};
  const rule one{.name = "api", .limit = fixed_window_policy(3, 1min)};
  const prepared_script pd = prepared(dual);
  const prepared_script p1 = prepared(one);
  batch_builder b;
  b.add(evalsha_command(pd, dual, {.tenant = "acme", .user = "bob"}, "sluice:", -1, -1), pd.script, 2);
  const command group = all_command({evalsha_command(p1, one, {.key = "k"}, "sluice:", -1, -1)}, {p1.script}, true);
  b.add_group(group, 1);
  b.add(evalsha_command(pd, dual, {.tenant = "acme", .user = "eve", .cost = 3}, "sluice:", -1, -1), pd.script, 2);
  EXPECT_EQ(decode(b.text(-1)), (std::vector<std::string>{"EVALSHA",
                                                          scripts()[batch_script].sha1,
                                                          "5",
                                                          tenant_key("sluice:", "d", "acme", "fw2.60000000"),
                                                          user_key("sluice:", "d", "acme", "bob", "fw2.60000000"),
                                                          single_key("sluice:", "api", "k", "fw2.60000000"),
                                                          tenant_key("sluice:", "d", "acme", "fw2.60000000"),
                                                          user_key("sluice:", "d", "acme", "eve", "fw2.60000000"),
                                                          "-",
                                                          "ffffffffffffffff",
                                                          "1",  // one parameter set: the dual-layer rule's
                                                          hex(static_cast<long long>(pd.script)),
                                                          "a",
                                                          hex(60'000'000),
                                                          "0",
                                                          "3",
                                                          hex(60'000'000),
                                                          "0",
                                                          "1",  // bob: set 1, cost 1
                                                          "1",
                                                          "0",  // the group: one check, recording, then its five
                                                          "1",
                                                          "1",
                                                          hex(static_cast<long long>(p1.script)),
                                                          "1",
                                                          "3",
                                                          hex(60'000'000),
                                                          "0",
                                                          "1",  // eve: set 1, cost 3
                                                          "3"}));
}

// The batch and all-or-nothing scripts' reply: {values as little-endian doubles, now}.
std::string packed(std::initializer_list<double> values) {
  std::string out;
  for (double v : values) {
    const auto bits = std::bit_cast<std::uint64_t>(v);
    for (int i = 0; i < 8; ++i) out += static_cast<char>(bits >> (8 * i) & 0xff);
  }
  return out;
}

TEST(ParseBatchReply, EachChecksValuesInOrderAndHostileRepliesRefused) {
  const rule one{.name = "api", .limit = fixed_window_policy(3, 1min)};
  const rule two{.name = "d", .limit = fixed_window_policy(3, 1min), .tenant = fixed_window_policy(10, 1min)};
  const prepared_script p1 = prepared(one);
  const prepared_script p2 = prepared(two);
  const std::vector<const prepared_script*> checks = {&p1, &p2, &p1};
  replies r;
  const auto reply = [&](std::initializer_list<double> values) {
    return r.array({r.string(packed(values)), r.integer(now_us)});
  };
  auto d = parse_batch_reply(checks, *reply({1, 2, 0, 500, 1, 9, 0, 7, 0, 3, 40, 7, 0, 0, 30, 6}));
  ASSERT_TRUE(d.ok()) << d.error().message;
  ASSERT_EQ(d->size(), 3u);
  EXPECT_TRUE((*d)[0].allowed);
  EXPECT_EQ((*d)[0].remaining, 2);
  EXPECT_FALSE((*d)[1].allowed);  // the user layer refused
  EXPECT_EQ((*d)[1].rejected_by, layer::user);
  EXPECT_FALSE((*d)[2].allowed);
  EXPECT_EQ((*d)[2].retry_after, 30us);
  EXPECT_FALSE(parse_batch_reply(checks, *reply({1, 2, 0, 500})).ok());  // short
  EXPECT_FALSE(parse_batch_reply(checks, *reply({1, 2, 0, 500, 1, 9, 0, 7, 0, 3, 40, 7, 0, 0, 30, 6, 1})).ok());
  EXPECT_FALSE(parse_batch_reply(checks, *reply({2, 2, 0, 500, 1, 9, 0, 7, 0, 3, 40, 7, 0, 0, 30, 6})).ok());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (double hostile : {nan, inf, -inf, 1e300}) {
    EXPECT_FALSE(parse_batch_reply(checks, *reply({1, hostile, 0, 500, 1, 9, 0, 7, 0, 3, 40, 7, 0, 0, 30, 6})).ok());
  }
  EXPECT_FALSE(
      parse_batch_reply(checks, *r.array({r.string(packed({1, 2, 0, 500, 1, 9, 0, 7, 0, 3, 40, 7, 0, 0, 30, 6}) + "x"),
                                          r.integer(now_us)}))
          .ok());  // not whole doubles
  EXPECT_FALSE(
      parse_batch_reply(checks, *r.integers({1, 2, 0, 500, 1, 9, 0, 7, 0, 3, 40, 7, 0, 0, 30, 6, now_us})).ok());
  EXPECT_FALSE(parse_batch_reply(checks, *r.string("OK")).ok());
}

}  // namespace
}  // namespace sluice::detail
