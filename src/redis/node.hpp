// SPDX-License-Identifier: Apache-2.0
// src/redis/node.hpp — one Redis server as the engine sees it: its connection, the checks waiting
// for it (its host name, its handshake, the batch being gathered), what it has in flight, its
// circuit breaker (breaker.hpp), its clock (server_clock.hpp) and its out-of-memory probe.
//
// A check sent to an idle node goes at once, alone; while calls are in flight there, the checks
// that arrive meanwhile wait for the ones the handlers queued now bring, and go together in one
// call of the batch script (one slot's a call, on a cluster). Each call carries its deadline on the
// node's clock. The node reads what every reply says of the node (its clock, whether it refuses
// scripts for want of memory) and hands the reply to its owner, which decides what it means for
// the check: a decision, a redirection, a failure.
//
// It reports to its owner through node_owner, and talks to its server through node_connection, so
// that it runs against a fake connection in tests (tests/unit/redis/node_test.cpp).
//
//   auto n = std::make_shared<node>(context, make_connection);  // make_connection(events) -> link
//   n->connect();
//   n->send(op, /*asking=*/false);  // later: owner.answered(*n, op, reply, false)
//
// Strand only (the owner's), except where marked.
#pragma once

#include <boost/asio/steady_timer.hpp>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/log_throttle.hpp"
#include "redis/breaker.hpp"
#include "redis/connection.hpp"
#include "redis/op.hpp"
#include "redis/server_clock.hpp"
#include "redis/strand.hpp"
#include "sluice/error.hpp"
#include "sluice/redis_options.hpp"

struct redisReply;

namespace sluice::detail {

class node;

/// What a node tells its owner (the engine), on the strand.
class node_owner {
 public:
  /// The reply to a check sent alone (null: the connection went away first; the script may have
  /// run). `asking`: it was sent after ASKING.
  virtual void answered(node& n, const op_ptr& o, redisReply* reply, bool asking) = 0;
  /// The reply to a batch's one call, the checks in the order they answer in (null: as above).
  virtual void answered_batch(node& n, std::vector<op_ptr>& ops, redisReply* reply) = 0;
  /// The handshake was answered, and what waited for it was sent.
  virtual void ready(node& n) = 0;
  /// The connection is gone, or could not be made; what waited on the node has failed.
  virtual void lost(node& n, const std::string& why) = 0;
  /// A check the node could not send, which it will not send again.
  virtual void failed(const op_ptr& o, errc code, const std::string& why) = 0;
  /// Whether the node answers changed (its circuit, its memory): readiness may have.
  virtual void health_changed(node& n) = 0;

 protected:
  ~node_owner() = default;
};

/// What the nodes of one engine count together. Thread-safe.
struct node_counters {
  std::atomic<std::uint64_t> calls{0};     // commands sent with a check (one per batch)
  std::atomic<std::uint64_t> connects{0};  // handshakes answered
  std::atomic<std::uint64_t> circuit_opens{0};
  std::atomic<std::uint64_t> script_reloads{0};  // a node said NOSCRIPT
  std::atomic<int> open_circuits{0};
};

/// What every node of an engine shares: its strand, options, owner, counters and the throttle of
/// its repeated warnings. They outlive the nodes' events (the owner closes its nodes first).
struct node_context {
  strand_type strand;
  const redis_options& options;
  node_owner& owner;
  node_counters& counters;
  log_throttle& log;
  bool one_slot_a_call = false;  // a cluster: a call's keys share one slot
};

class node : public std::enable_shared_from_this<node> {
 public:
  /// Makes the node's connection, given the events it must deliver to the node.
  using connection_factory = std::function<std::shared_ptr<node_connection>(connection::events)>;

  /// `who`: a sentinel's master sends nothing before its handshake (ROLE) has answered.
  node(const node_context& context, const connection_factory& make, connection::peer who = connection::peer::server);

  std::string address;  // as configured, or as the cluster names it: its key in the topology
  bool serves = false;  // cluster: a master of the current slot map (topology.cpp)

  node_connection& connection() noexcept { return *conn_; }
  /// Starts a connection unless one exists (or is being made).
  void connect() { conn_->connect(); }
  /// Sends `o` now, with the next batch, or once connected; or fails it (owner.failed) when the
  /// circuit is open or there is no connection. `asking`: ASKING first (never batched).
  void send(const op_ptr& o, bool asking);
  /// The checks waiting to be sent here (for the host name, the handshake, the batch), handed
  /// over to be sent elsewhere.
  std::vector<op_ptr> take_waiting();
  /// NOSCRIPT answered a batch: the batch script is loaded again for the next ones.
  void reload_batch_script();

  /// The handshake was answered (and the connection not lost since).
  bool ready() const noexcept { return ready_; }
  /// It refuses scripts for want of memory (maxmemory).
  bool out_of_memory() const noexcept { return out_of_memory_; }
  /// Ready, circuit closed, not out of memory: checks sent here can be decided.
  bool answers() const noexcept { return ready_ && !out_of_memory_ && !circuit_.is_open(); }
  bool circuit_open() const noexcept { return circuit_.is_open(); }
  /// Commands sent whose reply has not come.
  std::size_t in_flight() const noexcept { return in_flight_; }
  /// Nothing waits here, and nothing was sent for `period`.
  bool idle_for(steady::duration period, steady::time_point now) const noexcept;

  /// A reply decided a check: the run of failures ends.
  void succeeded() noexcept { circuit_.succeeded(); }
  /// `count` more consecutive failures (checks not answered in time, replies that decide nothing).
  /// At the threshold the circuit opens and the connection drops (soon: this may run inside its
  /// callbacks); the probe's new connection closes it again.
  void failed(std::size_t count);
  /// Opens the circuit (once) and probes until a new connection's handshake answers.
  void open_circuit(const std::string& why);

  /// No more events, waits or probes; what waited fails, what is in flight completes as
  /// unavailable.
  void close();

 private:
  struct reply_box;
  struct batch_box;

  void send_one(const op_ptr& o, bool asking);
  void flush_batch();
  void send_batch(std::vector<op_ptr> ops);
  static void on_reply(redisReply* reply, void* privdata);
  static void on_batch_reply(redisReply* reply, void* privdata);
  void observe(const redisReply& reply);
  void send_unsent();
  void fail_waiting(errc code, const std::string& why);
  void on_ready();
  void on_lost(const std::string& why);
  void set_out_of_memory(bool oom);
  void schedule_oom_probe();
  std::int64_t deadline_us(steady::time_point deadline) const;

  node_context ctx_;
  const connection::peer peer_;
  breaker circuit_;
  server_clock clock_;  // observed from its replies; sets the deadline of what is sent to it
  asio::steady_timer oom_probe_timer_;
  std::shared_ptr<node_connection> conn_;
  std::vector<std::pair<op_ptr, bool>> unsent_;  // waiting for the host name or the handshake; bool: ASKING first
  std::vector<op_ptr> batch_;                    // waiting for the flush posted while commands are in flight
  bool flush_posted_ = false;
  std::size_t in_flight_ = 0;
  bool ready_ = false;
  bool out_of_memory_ = false;
  bool closed_ = false;
  steady::time_point last_sent_{};
};

using node_ptr = std::shared_ptr<node>;

}  // namespace sluice::detail
