// SPDX-License-Identifier: Apache-2.0
// src/redis/command.hpp — a check as Redis sees it: the script call sent, and the reply read back.
//
// Pure functions over values: no socket, no hiredis context (a reply is hiredis's plain
// `redisReply` struct), so all of it is unit-tested without a redis-server.
//   - prepare_script: a rule → its script and packed parameters, made once per rule (validated:
//     the rule itself, and what the scripts compute exactly, exactness.hpp);
//   - evalsha_command: one check → the RESP text of EVALSHA sha numkeys keys... now cost
//     params... deadline, and its keys' cluster slot; set_deadline rewrites the deadline;
//     eval_command: the same call as EVAL, sent after NOSCRIPT;
//   - parse_reply: a script's reply → its decision; reply_time and is_expired_reply read what
//     every reply carries; parse_time_reply reads TIME's.
// The arguments and replies of the scripts are laid out in scripts.hpp.
//
//   auto call = sluice::detail::prepare_script(rule);                  // once, at prepare()
//   auto cmd = sluice::detail::evalsha_command(*call, rule, req, "sluice:", -1, deadline_us);
//   ... send cmd.text, then on the reply:
//   sluice::result<sluice::decision> d = sluice::detail::parse_reply(*call, *reply);
//
// Thread-safe: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/backend.hpp"
#include "sluice/decision.hpp"
#include "sluice/error.hpp"
#include "sluice/policy.hpp"

struct redisReply;   // <hiredis/hiredis.h>
struct redisReader;  // <hiredis/read.h>

namespace sluice::detail {

/// What every check of one rule sends besides its keys, cost and deadline.
struct prepared_script {
  std::size_t script = 0;         ///< Index into scripts().
  bool dual = false;              ///< A dual-layer rule: two keys, two layers in the reply.
  std::int64_t limit = 0;         ///< Single: the rule's capacity; dual: the user layer's.
  std::int64_t tenant_limit = 0;  ///< Dual only: the tenant layer's capacity.
  std::string params;             ///< RESP bulk strings: the tenant's then the user's, or the rule's.
  std::string tag;                ///< The keys' state tag (keys.hpp): the user layer's, or the rule's.
  std::string tenant_tag;         ///< Dual only: the tenant layer's.
  // A leased rule (rule::lease) only:
  std::string leased_params;    ///< RESP: the leased layer's algorithm index and three parameters.
  std::string user_params;      ///< Dual: the user layer's three parameters (checked without a lease).
  std::size_t user_script = 0;  ///< Dual: the user layer's single-layer script (and algorithm index).
};

/// The script and packed parameters of `r`. Errors (nothing made): what validate(r) refuses, and
/// what the scripts cannot compute exactly (errc::invalid_argument, exactness.hpp).
result<prepared_script> prepare_script(const rule& r);

/// One script call in RESP, with the offsets its EVAL form and its deadline need.
struct command {
  std::string text;          ///< *argc, EVALSHA, sha, numkeys, keys..., now, cost, params..., deadline.
  std::size_t header = 0;    ///< Length of "*argc CRLF".
  std::size_t rest = 0;      ///< Offset of numkeys: what EVAL shares with EVALSHA.
  std::size_t keys_at = 0;   ///< Offset of the first key's bulk string; keys_end: past the last.
  std::size_t keys_end = 0;  ///< Also where `now`'s bulk string starts.
  std::size_t args_at = 0;   ///< Offset of the cost's bulk string; args_end: past the parameters.
  std::size_t args_end = 0;
  std::size_t deadline_at = 0;  ///< Offset of the deadline's fixed-width digits (set_deadline).
  std::uint16_t slot = 0;       ///< The Redis Cluster slot of its keys (slot.hpp): they share one.

  /// The `now` argument's bulk string (only checks of one `now` share a batch).
  std::string_view now_argument() const { return std::string_view(text).substr(keys_end, args_at - keys_end); }
};

/// The EVALSHA of one check of `r`, prepared as `p`: the keys (keys.hpp) under `key_prefix`, then
/// `now_us` (-1: the script reads the server's TIME), the cost, the parameters and `deadline_us`
/// (server µs after which the script records nothing; -1: none).
/// Precondition: validate(req) passed and `req` checks `r`.
command evalsha_command(const prepared_script& p, const rule& r, const check_request& req, std::string_view key_prefix,
                        std::int64_t now_us, std::int64_t deadline_us);

/// Rewrites the deadline of `c` in place (server µs, -1: none): a command is built on the caller's
/// thread and its deadline set when it is sent, to the clock of the server it is sent to.
void set_deadline(command& c, std::int64_t deadline_us);

/// The call of `c` as EVAL with the script's `body` in place of EVALSHA and its hash.
std::string eval_command(const command& c, std::string_view body);

/// Many checks as one call of the batch script (scripts.cpp), built from their own commands: their
/// keys, then the `now` they share, the deadline, the parameter sets of their rules (each once:
/// a script's index, see scripts.hpp, and its parameters), and per check its set and cost.
///
///   batch_builder b;
///   for (op : waiting) b.add(op.call, op.rule.script, op.rule.dual ? 2 : 1);   // all of one `now`
///   send(b.text(deadline_us));  ... then parse_batch_reply(their prepared scripts, reply)
struct batch_builder {
  std::string keys;  ///< The key bulk strings, in order.
  std::string sets;  ///< Per parameter set: its kind, then its parameters.
  std::string args;  ///< Per check: its set (1-based; 0 for a group), cost.
  std::string now;   ///< The `now` bulk string the checks share.
  std::size_t numkeys = 0;
  std::size_t sets_argc = 0;  ///< Bulk strings in `sets`.
  std::size_t argc = 0;       ///< Bulk strings in `args`.
  std::size_t checks = 0;

  /// Adds `c` (of script `kind`, with `key_count` keys: 1, or 2 for a dual-layer rule). Every check
  /// added carries the `now` of the first (the real clock's is always -1; a test clock's may differ).
  void add(const command& c, std::size_t kind, int key_count);
  /// Adds a check_all's group of `count` single-layer checks, `c` being its all_command().
  void add_group(const command& c, std::size_t count);
  /// The EVALSHA of the batch script.
  std::string text(std::int64_t deadline_us) const;

 private:
  struct set_span {
    std::size_t kind, at, size;  // the parameters' bulk strings: sets[at, at + size)
  };
  std::vector<set_span> set_spans;
  // The 1-based index of the set of `kind` with `params` (`count` bulk strings), added if new.
  std::size_t set_of(std::size_t kind, std::string_view params, std::size_t count);
};

/// Each check's decision from the reply of the batch or the all-or-nothing script ({packed values,
/// now}, scripts.cpp), in order. Errors (errc::backend_protocol): another type or length, a value
/// no long long holds, an `allowed` not 0 or 1.
result<std::vector<decision>> parse_batch_reply(const std::vector<const prepared_script*>& checks, const redisReply& r);

/// The checks of one check_all() (one slot's, on a cluster) as one call of the all-or-nothing
/// script (scripts.cpp), built from their own commands: check i of a single-layer rule whose script
/// is `scripts[i]`. With `record` false the script only looks. Its deadline is set as any
/// command's (set_deadline); its slot is the first check's (they share one). It may also go in a
/// batch (batch_builder::add_group).
command all_command(const std::vector<command>& checks, const std::vector<std::size_t>& scripts, bool record);

/// Turns an all_command() that only looks into one that records when all admit.
void set_record(command& c);

/// A check of a leased rule that takes its lease (the lease scripts, scripts.cpp): `cost` checked
/// and up to `want` units of the leased layer recorded, its slots held for `hold_ns` (a token
/// bucket). A refill ahead of need (cost 0) leases the leased layer alone (a dual-layer rule's
/// tenant). Its deadline is set as any command's.
command lease_command(const prepared_script& p, const rule& r, const check_request& req, std::string_view key_prefix,
                      std::int64_t now_us, std::int64_t cost, std::int64_t want, std::int64_t hold_ns);

/// A dual-layer check's user layer alone, as a single-layer check of the user's key: the tenant's
/// unit came from a lease.
command user_layer_command(const prepared_script& p, const rule& r, const check_request& req,
                           std::string_view key_prefix, std::int64_t now_us);

/// The give-back of `units` of a lease taken with `token`, on the leased layer of `req`'s keys.
command give_back_command(const prepared_script& p, const rule& r, const check_request& req,
                          std::string_view key_prefix, std::int64_t now_us, std::string_view token, std::int64_t units);

/// The reset of `req`'s key (backend::reset): a single-layer rule's key, a dual-layer rule's user
/// of a tenant, or with no user the tenant's own.
command reset_command(const prepared_script& p, const rule& r, const check_request& req, std::string_view key_prefix,
                      std::int64_t now_us);

/// What a lease call answered.
struct lease_reply {
  decision check;             ///< The check's decision, as an exact check reports it (+ the lease's units left).
  decision leased;            ///< The leased layer's figures alone (a dual-layer rule's tenant layer).
  std::int64_t units = 0;     ///< Units leased, the check's own cost included; 0 when refused.
  std::string token;          ///< What the give-back compares.
  std::int64_t valid_us = 0;  ///< How long the units may be used, from the call's `now`.
};

/// The reply of lease_command() with `cost` and `want`; `leased_alone` for a refill's (the leased
/// layer's figures only). Errors (errc::backend_protocol): another shape or type, an `allowed` not
/// 0 or 1, units leased by a refusal, fewer than the cost or more than wanted, a token over 256
/// bytes.
result<lease_reply> parse_lease_reply(const prepared_script& p, bool leased_alone, std::int64_t cost, std::int64_t want,
                                      const redisReply& r);

/// The out-of-memory probe: EVAL of a script that declares writes (`#!lua`) but makes none, which
/// Redis refuses whole (an OOM error) while over maxmemory and answers 1 otherwise.
const std::string& oom_probe_command();

/// The server time (µs) every script reply ends with, or -1 when it does not (or is out of the
/// 0..2^53 the scripts compute in).
std::int64_t reply_time(const redisReply& r) noexcept;

/// True for {-1, now}: the script found its deadline passed and recorded nothing.
bool is_expired_reply(const redisReply& r) noexcept;

/// The decision of a script's reply: {allowed, remaining, retry µs, reset µs, now} for a single
/// layer, each layer's four then now for two (combined as in process, combine_layers). Anything
/// else — another type, another length, a non-integer element, allowed not 0 or 1 — is
/// errc::backend_protocol. A negative remaining counts as 0; a negative or overlong retry or reset
/// is `never`; retry_after is 0 when admitted.
result<decision> parse_reply(const prepared_script& p, const redisReply& r);

/// TIME's reply {seconds, microseconds} (two decimal strings) in µs, or -1 when malformed.
std::int64_t parse_time_reply(const redisReply& r) noexcept;

/// The most elements an array in a reply may hold. The longest the backend gets are the cluster's
/// maps: CLUSTER SLOTS has at most 16,384 ranges, a shard's slots in CLUSTER SHARDS at most 32,768
/// bounds. hiredis allocates an array's elements when it reads the header, so a hostile server's
/// "*2000000000" would otherwise allocate 16 GB.
inline constexpr int max_reply_array = 1 << 16;

/// The most values one reply may hold, each array's elements counted when its header is read: more
/// than three times the most the backend gets, CLUSTER SLOTS of 16,384 ranges with two replicas
/// each (about 300,000).
inline constexpr std::size_t max_reply_values = 1 << 20;

/// The most bytes of one reply: four times the longest the backend gets, CLUSTER SLOTS of 16,384
/// ranges with replicas (about 4 MB). It bounds the bytes of a reply's strings, and what a
/// connection holds of a reply before it is whole (hiredis keeps a string's bytes until it ends).
inline constexpr std::size_t max_reply_bytes = 16 << 20;

/// The longest line a reply may hold (a status, an error, a number, or a string's or an array's
/// length). hiredis scans a line from its start on every read until the line ends, so a line of n
/// bytes costs it time as n squared.
inline constexpr std::size_t max_reply_line = 64 << 10;

/// What a bounded reader has made of the reply it is reading, and what it refused.
struct reply_budget {
  enum class refusal { none, array, values, string_bytes, unsolicited };
  /// Replies the reader may still make: one per command queued on the connection; a reply no
  /// command waits for would answer the wrong one, so the reader refuses it first (the one
  /// subscriber, to a sentinel's +switch-master, leaves it unbounded). A reader fed by hand (tests, the fuzzer) leaves
  /// it unbounded.
  std::size_t awaited = std::numeric_limits<std::size_t>::max();
  std::size_t values = 0;        ///< values made, and promised by the arrays read
  std::size_t string_bytes = 0;  ///< bytes of the strings made
  refusal refused = refusal::none;
  long long refused_array = 0;  ///< when refused is array: its elements
};

/// Makes `reader` refuse a reply no command waits for (budget.awaited), or with an array of more
/// than max_reply_array elements, more than max_reply_values values, or more than max_reply_bytes
/// in its strings. hiredis makes each value as soon as it is read, so a hostile server's endless
/// arrays would otherwise grow memory for as long as it sends. A refused reply fails the reader as out of memory, and
/// `budget` (which must outlive the reader) tells why (the callbacks run inside hiredis, so they only note it).
void bound_replies(redisReader& reader, reply_budget& budget) noexcept;

/// Why the reader refused a reply, in words; empty when it has not.
std::string why_refused(const reply_budget& budget);

/// Why `reader`, once the whole replies it holds are read from it, must read no more: the reply
/// it is reading holds more than max_reply_bytes, or a line longer than max_reply_line. Empty
/// while it may go on.
std::string overlong_reply(const redisReader& reader);

}  // namespace sluice::detail
