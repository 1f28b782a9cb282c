// SPDX-License-Identifier: Apache-2.0
// src/redis/engine.hpp — the Redis backend's engine: a check's way from async_check to its decision,
// on one Redis server, on a Redis Cluster, or on the master Redis Sentinel names.
//
// A check is built on the caller's thread (command.hpp: its keys, slot and arguments), then posted
// to the strand, routed to the node that serves it (topology.hpp: the one server, the master the
// sentinels name (sentinel.hpp), or the master that owns its slot) and sent by that node (node.hpp:
// alone, or, while calls are in flight there, in one call of the batch script with the checks that
// arrive meanwhile; its deadline written on that node's clock). It completes with the first of:
// its reply, its deadline, the connection's loss. What Redis cannot answer follows on_error; each
// node's circuit breaker stops paying the timeout while that node is down.
//
// engine.cpp holds the check's way in, its deadline and on_error; script_send.cpp its call sent and
// its reply read; slot_routing.cpp the cluster's slot map kept current (discovery from the seeds, refreshes)
// and the redirections; node_events.cpp the nodes made and what they report; lease_client.hpp a leased
// rule's checks (lease_table.hpp). On a cluster a reply may send the check on: MOVED (the map is
// patched and refreshed), ASK (once, after ASKING), TRYAGAIN and CLUSTERDOWN (after a capped
// backoff, as often as the deadline allows), READONLY (after a refresh) — each only within the
// check's deadline, and to another node at most max_redirects times. With Sentinel, READONLY and
// LOADING (an old master, a restarted one) and a lost connection make the sentinels be asked again;
// a check that a READONLY or LOADING reply refused waits, within its deadline, for the master they
// name; a new master takes the checks not yet sent to the old one. A reply that never came (a
// lost connection) is never resent: the script may have run.
//
// An engine serves the checks of one io_context. A backend on several (sluiced: one per io thread)
// has one engine on each, each with its own connections, so that a check is decided on the thread
// that asked; the first engine (the leader) finds the servers and tells the others (followers)
// what it found: the cluster's slot maps, the master the sentinels name. A follower's wish for a
// new map, or for the sentinels to be asked again, goes to the leader. Leased rules are the
// leader's: one lease table per rule, whichever thread checks it.
//
// Thread-safe where marked; everything else runs on `strand_`.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/log_throttle.hpp"
#include "redis/cluster_topology.hpp"
#include "redis/command.hpp"
#include "redis/connection.hpp"
#include "redis/lease_client.hpp"
#include "redis/lease_table.hpp"
#include "redis/node.hpp"
#include "redis/op.hpp"
#include "redis/sentinel.hpp"
#include "redis/strand.hpp"
#include "redis/topology.hpp"
#include "sluice/memory_backend.hpp"
#include "sluice/redis_backend.hpp"

struct redisReply;

namespace sluice::detail {

/// Most times one check is sent on by a cluster to another node (MOVED, ASK, READONLY).
inline constexpr int max_redirects = 5;
/// Slot map refreshes start at most this often (MOVED and lost connections ask for one).
inline constexpr std::chrono::milliseconds min_refresh_gap{100};

class engine : public std::enable_shared_from_this<engine>, private node_owner {
  friend class lease_client;  // sends its calls as ops, completes them, reads the failure policy

 public:
  /// `tls`: the TLS settings of every connection (tls.hpp), or nullptr for plaintext.
  engine(const redis_options& o, std::vector<endpoint> seeds, topology_kind t, std::shared_ptr<const tls_settings> tls,
         asio::io_context& io, std::shared_ptr<memory_backend> local);

  /// Makes this engine a follower of `leader` (same options, on another io_context). Before start().
  void follow(const std::shared_ptr<engine>& leader);
  void start();
  /// Fails everything still waiting and closes the connections. Must not run on the io threads
  /// unless inside the strand.
  void shutdown();

  /// Thread-safe.
  bool on_io_thread() const { return io_.get_executor().running_in_this_thread(); }
  result<std::shared_ptr<redis_prepared_rule>> prepare(const rule& r, const backend* owner);
  /// A check (a check_all) that backend::async_check (async_check_all) validated.
  void async_check(const check_request& req, check_handler handler);
  void async_check_all(std::span<const check_request> checks, check_all_handler handler);
  /// A reset that backend::async_reset validated: a leased key's leases forgotten here, then its
  /// key deleted on Redis. A failure is an error, whatever on_error says.
  void async_reset(const check_request& req, reset_handler handler);
  bool ready() const { return ready_.load(std::memory_order_relaxed); }
  bool cluster() const noexcept { return kind_ == topology_kind::cluster; }
  bool sentinel() const noexcept { return kind_ == topology_kind::sentinel; }
  redis_backend_stats stats() const;
  /// This engine's leased rules (a follower's go to its leader's).
  lease_client& leases() noexcept { return leader_ ? leader_->leases_ : leases_; }

 private:
  // --- the check's path (engine.cpp, script_send.cpp) --------------------------------------------
  static result<std::shared_ptr<redis_prepared_rule>> prepare_script(const rule& r, const backend* owner);
  // Precondition (validate): req.rule was prepared by this engine's backend.
  static const redis_prepared_rule& prepared_of(const check_request& req) noexcept {
    return static_cast<const redis_prepared_rule&>(*req.rule);
  }
  std::int64_t now_us() const;
  void send_check(const check_request& req, const redis_prepared_rule* prepared, check_handler handler);
  void submit(op_ptr o);
  void dispatch(const op_ptr& o);
  void send_to(node& n, const op_ptr& o, bool asking);
  bool redirect(const op_ptr& o, node& n, std::string_view message, bool asking);
  void retry_later(const op_ptr& o);
  void failed_reply(const op_ptr& o, node& n, std::string_view why);
  void complete(const op_ptr& o, result<decision> r);
  void submit_part(const std::shared_ptr<all_call>& call, command c, std::vector<std::size_t> part);
  void complete_part(const op_ptr& o, result<std::vector<decision>> r);
  result<std::vector<decision>> part_failure(const op& o);
  void fail(const op_ptr& o, errc code, std::string_view why);
  result<decision> failure_decision(const check_request& req, const redis_prepared_rule& prepared);
  void trim_inflight();
  void arm_deadline();
  void expire_due();

  // --- a reply read (script_reply.cpp) -------------------------------------------------------------
  void answered(node& n, const op_ptr& o, redisReply* reply, bool asking) override;
  void answered_batch(node& n, std::vector<op_ptr>& ops, redisReply* reply) override;

  // --- the nodes: made, and what they report (node_events.cpp) -----------------------------------
  node_ptr make_node(const endpoint& where, connection::peer who = connection::peer::server);
  void on_master(const endpoint& where);
  void ready(node& n) override;
  void lost(node& n, const std::string& why) override;
  void failed(const op_ptr& o, errc code, const std::string& why) override { fail(o, code, why); }
  void health_changed(node&) override { update_ready(); }
  void do_shutdown();

  // --- the slot map and redirections (slot_routing.cpp) ----------------------------------------
  node* route(const op& o) const { return topology_.route(o.call.slot); }  // null: wait
  node* node_at(const std::string& address);
  void await_map(const op_ptr& o);
  void request_refresh();  // a follower's goes to the leader
  void ask_sentinels();    // the same
  void send_awaiting(bool updated);
  void schedule_refresh(steady::duration after, bool replace = false);
  void start_refresh();
  void send_topology_query(node& n, bool shards);
  static void on_topology_reply(redisReply* reply, void* privdata);
  void handle_topology(node& n, redisReply* reply, bool shards, std::uint64_t refresh);
  void finish_refresh(bool updated);
  void apply_map(const std::vector<slot_owner>& owners);
  void retire_idle_nodes();
  void update_ready();

  const redis_options options_;
  const topology_kind kind_;
  const std::vector<endpoint> seeds_;
  asio::io_context& io_;
  const std::shared_ptr<const tls_settings> tls_;
  strand_type strand_;
  asio::steady_timer deadline_timer_;
  std::shared_ptr<memory_backend> local_;  // shared by the leader and its followers
  log_throttle log_;
  std::shared_ptr<engine> leader_;                // a follower's; null on the leader
  std::vector<std::weak_ptr<engine>> followers_;  // the leader's; set before start()

  // Strand only.
  topology topology_;                           // which node serves each slot
  std::shared_ptr<sentinel_watch> sentinel_;    // sentinel, on the leader
  std::deque<op_ptr> inflight_;                 // accepted and not yet failed by the deadline, in deadline order
  std::vector<op_ptr> awaiting_map_;            // no master known for their slot (sentinel: at all) yet
  asio::steady_timer refresh_timer_;            // cluster
  std::uint64_t refresh_timer_generation_ = 0;  // a wait of an older generation was replaced
  steady::time_point refresh_due_{};            // when the armed wait ends (if armed)
  bool refresh_armed_ = false;
  std::uint64_t refresh_generation_ = 0;  // one per query: a late answer to an older one is dropped
  bool refreshing_ = false;
  bool refresh_wanted_ = false;  // asked for while no node could answer: on the next ready node
  steady::time_point refresh_started_{};
  std::size_t next_query_node_ = 0;  // round robin over the masters asked
  bool deadline_armed_ = false;
  bool stopping_ = false;
  lease_client leases_;          // sends through this engine
  node_counters node_counters_;  // any thread

  // Any thread.
  std::atomic<bool> ready_{false};
  std::atomic<bool> out_of_memory_{false};
  std::atomic<std::uint64_t> pending_{0};
  std::atomic<std::uint64_t> masters_{0};
  std::atomic<std::uint64_t> checks_{0}, redis_decisions_{0}, timeouts_{0}, unavailable_{0}, protocol_errors_{0},
      overloaded_{0}, fail_open_{0}, fail_closed_{0}, local_fallback_{0}, redirections_{0}, retries_{0},
      topology_refreshes_{0}, master_switches_{0};
};

}  // namespace sluice::detail
