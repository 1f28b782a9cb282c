// SPDX-License-Identifier: Apache-2.0
// src/redis/cluster_topology.hpp — what a Redis Cluster says about itself, read from its replies.
//
// Pure functions over hiredis's plain `redisReply` (no socket), unit-tested with hostile replies:
//   - parse_cluster_shards / parse_cluster_slots: which master serves which slots, from CLUSTER
//     SHARDS (Redis 7; 7.0.x may send slot numbers as strings) or CLUSTER SLOTS (older servers);
//   - classify_error and parse_redirection: what an error reply asks of the client (MOVED, ASK,
//     TRYAGAIN, CLUSTERDOWN, READONLY, NOSCRIPT, OOM).
// An address a node leaves empty ("the one you asked") is the replying node's host; "?" (unknown) is
// no address: CLUSTER SHARDS then falls back to the node's ip, elsewhere its slots stay unknown.
//
//   auto owners = sluice::detail::parse_cluster_shards(*reply, "10.0.0.5");
//   for (const auto& o : *owners) ...  // {first, last, "10.0.0.7:6379"}
//
// Thread-safe: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/error.hpp"

struct redisReply;  // <hiredis/hiredis.h>

namespace sluice::detail {

/// Slots first..last (inclusive) are served by the master at `master` ("host:port", IPv6 in brackets).
struct slot_owner {
  std::uint16_t first = 0;
  std::uint16_t last = 0;
  std::string master;

  bool operator==(const slot_owner&) const = default;
};

/// The masters of CLUSTER SHARDS's reply, sorted by first slot. Errors (errc::backend_protocol): not
/// the reply's shape, a slot out of 0..16383 or a range backwards, ranges that overlap, a master with
/// slots but no usable address, more ranges than slots. Shards without slots, or without a master
/// that has not failed, are left out; of several masters in a shard (a failed one is still listed
/// after a failover), one whose health is online is taken. With `tls`, a node's `tls-port` is its
/// port (the plaintext `port` only when it has no TLS port).
result<std::vector<slot_owner>> parse_cluster_shards(const redisReply& r, std::string_view replying_host, bool tls);

/// The same from CLUSTER SLOTS's reply: [first, last, [host, port, ...], replicas...] per range.
result<std::vector<slot_owner>> parse_cluster_slots(const redisReply& r, std::string_view replying_host);

/// What an error reply from a cluster node means to the client.
enum class reply_error {
  other,        ///< Anything else: the check fails.
  moved,        ///< MOVED slot host:port: the slot lives elsewhere now; update the map, resend.
  ask,          ///< ASK slot host:port: this one command goes there, after ASKING.
  tryagain,     ///< TRYAGAIN: the slot is being migrated and the keys are split; retry shortly.
  clusterdown,  ///< CLUSTERDOWN: the cluster cannot serve the slot now; retry shortly.
  readonly,     ///< READONLY: a replica (an old master after failover); refresh the map.
  loading,      ///< LOADING: a restarted server loading its data; with Sentinel, ask where the master is.
  noscript,     ///< NOSCRIPT: the node does not know the script; send its body.
  oom,          ///< OOM: over maxmemory.
};

reply_error classify_error(std::string_view message) noexcept;

/// Where MOVED or ASK sends a command.
struct redirection {
  std::uint16_t slot = 0;
  std::string address;  ///< "host:port", IPv6 in brackets.
};

/// "MOVED 3999 127.0.0.1:6381" or "ASK ..." (an empty host is the replying node's); nullopt when the
/// message is neither or is malformed (a slot out of range, no port).
std::optional<redirection> parse_redirection(std::string_view message, std::string_view replying_host);

/// The host of "host:port" (an IPv6 address without its brackets): what an empty host in the replies
/// of the node at `address` stands for.
std::string host_of(std::string_view address);

/// "host:port", with an IPv6 host in brackets and an empty host replaced by `replying_host`.
std::string node_address(std::string_view host, long long port, std::string_view replying_host);

}  // namespace sluice::detail
