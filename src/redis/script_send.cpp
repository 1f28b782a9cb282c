// SPDX-License-Identifier: Apache-2.0
// A script sent and its reply read (engine.hpp): a check goes to the node serving it (node.hpp
// sends it alone or in a batch, as EVALSHA, or as EVAL once the node said NOSCRIPT, its deadline on
// the node's clock); its reply is a decision, a redirection (slot_routing.cpp), or a failure.
#include <hiredis/hiredis.h>

#include "redis/engine.hpp"
#include "redis/scripts.hpp"

namespace sluice::detail {

void engine::send_to(node& n, const op_ptr& o, bool asking) {
  // Not connected, and not connecting: where its slots went, the next map says.
  if (kind_ == topology_kind::cluster && !n.circuit_open() && !n.connection().resolving() && !n.connection().open()) {
    request_refresh();
  }
  n.send(o, asking);
}

// Checks that timed out meanwhile (done) keep their places in the reply, and are skipped.
void engine::answered_batch(node& n, std::vector<op_ptr>& ops, redisReply* reply) {
  if (reply == nullptr) {
    // The script may have run: none of them is sent again.
    for (auto& o : ops) fail(o, errc::backend_unavailable, "connection to " + n.address + " lost");
    return;
  }
  if (reply->type == REDIS_REPLY_ERROR) {
    const std::string_view msg(reply->str, reply->len);
    const reply_error kind = classify_error(msg);
    if (kind != reply_error::oom && kind != reply_error::other) {
      // The script did not run (a redirection, a migration, a node without it): each check goes
      // again, alone, and takes its own way. A node that forgot the batch script learns it again
      // for the next batches.
      if (kind == reply_error::noscript) n.reload_batch_script();
      for (auto& o : ops) {
        o->alone = true;
        dispatch(o);
      }
      return;
    }
    n.succeeded();
    for (auto& o : ops) {
      fail(o, errc::backend_protocol, "Redis error from " + n.address + ": " + std::string(msg.substr(0, 200)));
    }
    return;
  }
  if (is_expired_reply(*reply)) {
    n.succeeded();
    for (auto& o : ops)
      fail(o, errc::backend_timeout, "the checks reached Redis after their deadline; nothing was recorded");
    return;
  }
  // A check_all's group answers for each of its checks, in order.
  std::vector<const prepared_script*> calls;
  calls.reserve(ops.size());
  for (const auto& o : ops) {
    if (!o->all) {
      calls.push_back(&o->rule->call);
      continue;
    }
    for (std::size_t i : o->part) calls.push_back(&o->all->rules[i]->call);
  }
  auto decisions = parse_batch_reply(calls, *reply);
  if (!decisions) {
    n.failed(ops.size());
    for (auto& o : ops) fail(o, errc::backend_protocol, decisions.error().message);
    return;
  }
  n.succeeded();
  std::size_t at = 0;
  for (auto& o : ops) {
    const std::size_t count = o->all ? o->part.size() : 1;
    const auto first = decisions->begin() + static_cast<std::ptrdiff_t>(at);
    at += count;
    if (o->done) continue;
    redis_decisions_.fetch_add(count, std::memory_order_relaxed);
    if (o->all) {
      complete_part(o, std::vector<decision>(first, first + static_cast<std::ptrdiff_t>(count)));
    } else {
      complete(o, *first);
    }
  }
  trim_inflight();
}

void engine::answered(node& n, const op_ptr& o, redisReply* reply, bool asking) {
  if (o->done) return;  // timed out already
  if (reply == nullptr) {
    // The connection is going away; its loss is handled (and counted for the breaker) once. The
    // script may have run: the check is never sent again.
    return fail(o, errc::backend_unavailable, "connection to " + n.address + " lost");
  }
  // A reply that decides the check, an error included, shows the node works; one that decides
  // nothing (malformed, or a redirection or retry not followed: past max_redirects, to no usable
  // node) counts for its breaker as a timeout does. One followed counts as what comes of it.
  if (reply->type == REDIS_REPLY_ERROR) {
    const std::string_view msg(reply->str, reply->len);
    if (redirect(o, n, msg, asking)) return;
    std::string why = "Redis error from " + n.address + ": " + std::string(msg.substr(0, 200));
    const reply_error kind = classify_error(msg);
    if (kind != reply_error::other && kind != reply_error::oom) {
      if (o->redirects > 0) why += " (after " + std::to_string(o->redirects) + " redirections)";
      return failed_reply(o, n, why);
    }
    n.succeeded();
    return fail(o, errc::backend_protocol, why);
  }
  if (is_expired_reply(*reply)) {
    n.succeeded();
    return fail(o, errc::backend_timeout, "the check reached Redis after its deadline; nothing was recorded");
  }
  if (o->lease) {
    leases_.answered(o, n, *reply);
    trim_inflight();
    return;
  }
  if (o->reset) {
    n.succeeded();
    complete(o, decision{});
    trim_inflight();
    return;
  }
  if (o->all) {
    std::vector<const prepared_script*> calls;
    for (std::size_t i : o->part) calls.push_back(&o->all->rules[i]->call);
    auto decisions = parse_batch_reply(calls, *reply);
    if (!decisions) return failed_reply(o, n, decisions.error().message);
    n.succeeded();
    redis_decisions_.fetch_add(o->part.size(), std::memory_order_relaxed);
    complete_part(o, std::move(decisions));
    trim_inflight();
    return;
  }
  auto d = parse_reply(o->rule->call, *reply);
  if (!d) return failed_reply(o, n, d.error().message);
  n.succeeded();
  redis_decisions_.fetch_add(1, std::memory_order_relaxed);
  complete(o, std::move(d));
  trim_inflight();
}

// A reply of `n` that decided nothing: a failure of the node, then of the check.
void engine::failed_reply(const op_ptr& o, node& n, std::string_view why) {
  n.failed(1);
  fail(o, errc::backend_protocol, why);
}

}  // namespace sluice::detail
