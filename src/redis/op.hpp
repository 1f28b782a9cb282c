// SPDX-License-Identifier: Apache-2.0
// src/redis/op.hpp — a check on its way through the Redis backend (engine.hpp): the rule as
// prepare() made it, the check's op (its call, deadline and where it was sent), and a check_all
// shared by its parts.
//
// Not thread-safe: an op lives on its engine's strand; all_call's fields are guarded as marked.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "redis/command.hpp"
#include "redis/lease_table.hpp"
#include "sluice/backend.hpp"

namespace sluice::detail {

using steady = std::chrono::steady_clock;

class engine;
class node;
struct lease_call;

/// What prepare() makes of a rule: its script call, the rule as the local fallback prepared it, and
/// a leased rule's leases, given back when it is dropped.
struct redis_prepared_rule final : prepared_rule {
  redis_prepared_rule(const rule& r, const backend* owner) : prepared_rule(r, owner) {}
  ~redis_prepared_rule() override;
  prepared_script call;
  prepared_rule_ptr local;              // on_error = local only
  std::shared_ptr<lease_table> leases;  // rule::lease only
  std::weak_ptr<engine> give_back_to;   // leases only: where to give them back
};

/// One check_all(), shared by its ops (one per slot on a cluster, one on a single Redis): each
/// decides its part of the checks in one call of the all-or-nothing script, and the last to finish
/// calls the handler.
struct all_call {
  std::vector<check_request> reqs;  // the caller's: views valid until the handler runs
  std::vector<const redis_prepared_rule*> rules;
  std::vector<bool> never;  // a cost its rule never admits: looked at with cost 1, and refused
  check_all_handler handler;
  std::mutex mutex;
  std::vector<decision> out;    // guarded by mutex
  std::optional<error> failed;  // guarded by mutex
  std::size_t parts_left = 0;   // guarded by mutex
  // Over several slots (a cluster), a first round only looks at each; the second records, sent
  // only when every check would admit. The parts' calls and checks, for the second round.
  bool looking = false;  // guarded by mutex
  std::vector<command> part_calls;
  std::vector<std::vector<std::size_t>> part_checks;
};

/// One check (or one part of a check_all) on its way through the backend.
struct op {
  check_request req;                          // views valid until the handler runs
  const redis_prepared_rule* rule = nullptr;  // req.rule's, held by the caller as the views
  check_handler handler;
  command call;  // EVALSHA, formatted once; its deadline set at each send
  steady::time_point deadline;
  node* sent_to = nullptr;  // the node whose reply it waits for; null while it waits for a route
  int redirects = 0;        // MOVED, ASK, READONLY so far (at most max_redirects)
  int retries = 0;          // TRYAGAIN, CLUSTERDOWN so far (as many as its deadline allows)
  bool done = false;
  bool eval = false;                  // sent as EVAL since a node said NOSCRIPT
  bool alone = false;                 // never batched again: its batch was refused whole (a redirection)
  std::shared_ptr<all_call> all;      // a part of a check_all: then `req`, `rule` and `handler` are unused
  std::vector<std::size_t> part;      // the indices of its checks in all->reqs
  std::shared_ptr<lease_call> lease;  // a lease's call (never batched)
  bool reset = false;                 // a reset's call (never batched): answered done or failed

  std::size_t script() const;  // the index of the script it calls
};

using op_ptr = std::shared_ptr<op>;

}  // namespace sluice::detail
