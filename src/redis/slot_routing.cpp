// SPDX-License-Identifier: Apache-2.0
// The slot map of a Redis Cluster (engine.hpp): which master serves each slot, learnt from the seeds
// and kept current.
//
// The map comes from CLUSTER SHARDS (CLUSTER SLOTS on servers without it), asked of a master that
// answers, in turn, or of a seed before the first map. It is refreshed when a check meets MOVED,
// READONLY or CLUSTERDOWN and when a connection is lost (at most every min_refresh_gap), every
// breaker_probe_interval while some slot has no master that answers (a failover under way), and
// every cluster_refresh_interval otherwise. Each master gets one connection; a node that no longer
// serves slots is closed once nothing waits on it. The replies that send a check on (MOVED, ASK,
// TRYAGAIN, CLUSTERDOWN, READONLY; with Sentinel READONLY and LOADING) are followed here too.
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>
#include <set>

#include "core/log_value.hpp"
#include "redis/engine.hpp"
#include "redis/slot.hpp"

namespace sluice::detail {

node* engine::node_at(const std::string& address) {
  if (node* known = topology_.find(address)) return known;
  if (!topology_.has_room()) return nullptr;
  auto where = parse_endpoint(address);
  if (!where) return nullptr;
  node_ptr n = make_node(*where);
  n->address = address;
  node& added = topology_.add(std::move(n));
  added.connect();
  return &added;
}

// No master is known for the check's slot (before the first map, or a shard without a master): it
// waits for the next map, unless no node could give one.
void engine::await_map(const op_ptr& o) {
  if (kind_ == topology_kind::sentinel) {
    awaiting_map_.push_back(o);  // sent when a master's handshake is answered (on_node_ready)
    return;
  }
  const auto& nodes = topology_.nodes();
  const bool reachable = std::any_of(nodes.begin(), nodes.end(), [](const auto& e) {
    return e.second->connection().open() || e.second->connection().resolving();
  });
  if (!reachable && !nodes.empty()) {
    request_refresh();
    return fail(o, errc::backend_unavailable, "no Redis Cluster node is reachable");
  }
  awaiting_map_.push_back(o);
  request_refresh();
}

void engine::request_refresh() {
  if (!leader_) return schedule_refresh(steady::duration::zero());
  asio::post(leader_->strand_, [leader = leader_] { leader->request_refresh(); });
}

void engine::ask_sentinels() {
  if (!leader_) return sentinel_->ask();
  asio::post(leader_->strand_, [leader = leader_] {
    if (!leader->stopping_) leader->sentinel_->ask();
  });
}

// Always through the timer, never at once: callers may be inside a connection's callbacks. Only
// the leader asks for maps.
void engine::schedule_refresh(steady::duration after, bool replace) {
  if (stopping_ || kind_ != topology_kind::cluster || leader_) return;
  const auto at = std::max(steady::now() + after, refresh_started_ + min_refresh_gap);
  if (refresh_armed_ && refresh_due_ <= at && !replace) return;
  refresh_armed_ = true;
  refresh_due_ = at;
  const std::uint64_t generation = ++refresh_timer_generation_;
  refresh_timer_.expires_at(at);  // an earlier wait ends now, and finds a newer generation
  refresh_timer_.async_wait(
      asio::bind_executor(strand_, [self = shared_from_this(), generation](boost::system::error_code) {
        if (generation != self->refresh_timer_generation_ || self->stopping_) return;
        self->refresh_armed_ = false;
        self->start_refresh();
      }));
}

void engine::start_refresh() {
  if (stopping_) return;
  const auto now = steady::now();
  if (refreshing_ && now - refresh_started_ < options_.connect_timeout) {
    // One query at a time; one that never answers is given up after connect_timeout.
    schedule_refresh(refresh_started_ + options_.connect_timeout - now);
    return;
  }
  // A master that answers, in turn; else any node that answers (a seed).
  node* asked = nullptr;
  std::vector<node*> candidates;
  for (const auto& [address, n] : topology_.nodes()) {
    if (n->ready() && !n->circuit_open()) candidates.push_back(n.get());
  }
  std::stable_partition(candidates.begin(), candidates.end(), [](node* n) { return n->serves; });
  const auto masters = std::count_if(candidates.begin(), candidates.end(), [](node* n) { return n->serves; });
  if (masters > 0) {
    asked = candidates[next_query_node_++ % static_cast<std::size_t>(masters)];
  } else if (!candidates.empty()) {
    asked = candidates.front();
  }
  if (asked == nullptr) {
    // Nothing answers yet: (re)connect the seeds; the first one ready asks (on_node_ready).
    refresh_wanted_ = true;
    for (const std::string& seed : options_.addresses) {
      node* n = node_at(seed);
      if (n != nullptr && !n->connection().open() && !n->connection().resolving() && !n->circuit_open()) n->connect();
    }
    schedule_refresh(options_.breaker_probe_interval);
    return;
  }
  refresh_wanted_ = false;
  refreshing_ = true;
  refresh_started_ = now;
  ++refresh_generation_;
  send_topology_query(*asked, true);
  schedule_refresh(options_.connect_timeout);  // a query never answered is not the last one
}

namespace {
struct topology_box {
  engine* owner;
  node_ptr n;
  bool shards;
  std::uint64_t refresh;
};
}  // namespace

void engine::send_topology_query(node& n, bool shards) {
  static const std::string shards_command = "*2\r\n$7\r\nCLUSTER\r\n$6\r\nSHARDS\r\n";
  static const std::string slots_command = "*2\r\n$7\r\nCLUSTER\r\n$5\r\nSLOTS\r\n";
  auto* box = new topology_box{this, n.shared_from_this(), shards, refresh_generation_};
  if (!n.connection().send(shards ? shards_command : slots_command, &engine::on_topology_reply, box)) {
    delete box;
    refreshing_ = false;
    schedule_refresh(options_.breaker_probe_interval);
  }
}

void engine::on_topology_reply(redisReply* reply, void* privdata) {
  std::unique_ptr<topology_box> box(static_cast<topology_box*>(privdata));
  box->owner->handle_topology(*box->n, reply, box->shards, box->refresh);
}

void engine::handle_topology(node& n, redisReply* reply, bool shards, std::uint64_t refresh) {
  if (refresh != refresh_generation_ || stopping_) return;  // a later query replaced it
  if (reply == nullptr) return finish_refresh(false);       // the connection went: the loss asks again
  if (reply->type == REDIS_REPLY_ERROR && shards) return send_topology_query(n, false);  // before Redis 7
  result<std::vector<slot_owner>> owners = error(errc::backend_protocol, "CLUSTER SLOTS refused");
  if (reply->type == REDIS_REPLY_ERROR) {
    owners = error(errc::backend_protocol,
                   "CLUSTER SLOTS: " + std::string(reply->str, std::min<std::size_t>(reply->len, 200)));
  } else if (shards) {
    owners = parse_cluster_shards(*reply, host_of(n.address), tls_ != nullptr);
    const auto covered = [](const std::vector<slot_owner>& v) {
      std::size_t c = 0;
      for (const auto& o : v) c += static_cast<std::size_t>(o.last - o.first) + 1;
      return c;
    };
    // Slots CLUSTER SHARDS leaves without a master (a shard listing its failed old master's empty
    // slots, Redis 7.2): CLUSTER SLOTS may know them.
    if (owners && covered(*owners) < slot_count) return send_topology_query(n, false);
  } else {
    owners = parse_cluster_slots(*reply, host_of(n.address));
  }
  if (!owners) {
    if (std::uint64_t count = log_.occurred()) {
      spdlog::warn("event=redis_no_slot_map address={} error={} errors={}", log_value(n.address),
                   log_value(owners.error().message), count);
    }
    return finish_refresh(false);
  }
  apply_map(*owners);
  finish_refresh(true);
}

// Checks that waited for a map go now, to the masters it names, or fail when it names none.
void engine::finish_refresh(bool updated) {
  refreshing_ = false;
  if (updated) topology_refreshes_.fetch_add(1, std::memory_order_relaxed);
  send_awaiting(updated);
  // The next one, in place of the query's own time limit.
  schedule_refresh(topology_.healthy() && updated ? options_.cluster_refresh_interval : options_.breaker_probe_interval,
                   true);
}

void engine::send_awaiting(bool updated) {
  auto waiting = std::move(awaiting_map_);
  awaiting_map_.clear();
  for (auto& o : waiting) {
    if (o->done) continue;
    if (!updated) {
      awaiting_map_.push_back(std::move(o));  // the next map, or their deadline
    } else if (route(*o) == nullptr) {
      fail(o, errc::backend_unavailable, "no master serves slot " + std::to_string(o->call.slot));
    } else {
      dispatch(o);
    }
  }
}

void engine::apply_map(const std::vector<slot_owner>& owners) {
  std::set<std::string_view> masters;
  for (const auto& o : owners) masters.insert(o.master);
  if (masters.size() > max_nodes) {
    if (std::uint64_t count = log_.occurred()) {
      spdlog::warn("event=redis_slot_map_ignored masters={} max_masters={} errors={}", masters.size(), max_nodes,
                   count);
    }
    return;
  }
  topology_.apply(owners, [this](const std::string& address) { return node_at(address); });
  masters_.store(masters.size(), std::memory_order_relaxed);
  update_ready();
  for (const auto& weak : followers_) {
    if (auto f = weak.lock()) {
      asio::post(f->strand_, [f, owners] {
        if (f->stopping_) return;
        f->apply_map(owners);
        f->send_awaiting(true);
      });
    }
  }
  // Not from inside the callback that brought the map: closing frees a connection's context.
  asio::post(strand_, [self = shared_from_this()] { self->retire_idle_nodes(); });
}

// Nodes that serve no slot, on which nothing waits and to which nothing was sent for a refresh
// interval (old masters, replicas given as seeds; not the node a slot is being migrated to, which
// ASK keeps sending to while it serves no slot yet).
void engine::retire_idle_nodes() {
  if (stopping_) return;
  const auto now = steady::now();
  const auto idle = [&](const node& n) { return n.idle_for(options_.cluster_refresh_interval, now); };
  for (const node_ptr& n : topology_.take_idle(idle)) n->close();
}

void engine::update_ready() {
  ready_.store(topology_.healthy(), std::memory_order_relaxed);
  out_of_memory_.store(topology_.out_of_memory(), std::memory_order_relaxed);
}

// The error replies that say the script did not run and where (or when) to send it: true when the
// check was sent on (or waits to be).
bool engine::redirect(const op_ptr& o, node& n, std::string_view msg, bool asking) {
  const reply_error kind = classify_error(msg);
  if (kind == reply_error::noscript) {
    // The node forgot the script (SCRIPT FLUSH, restart, a new node): send its body; EVAL caches it.
    if (o->eval || !n.connection().open()) return false;
    o->eval = true;
    node_counters_.script_reloads.fetch_add(1, std::memory_order_relaxed);
    send_to(n, o, asking);
    return true;
  }
  if (kind_ == topology_kind::sentinel && (kind == reply_error::readonly || kind == reply_error::loading)) {
    // An old master (now a replica), or one loading its data after a restart: the script did not
    // run. The check waits for the master the sentinels name next.
    redirections_.fetch_add(1, std::memory_order_relaxed);
    n.connection().drop_soon(n.address + " answered " + std::string(msg.substr(0, msg.find(' '))) +
                             ": no longer the master, asking the sentinels");
    await_map(o);
    return true;
  }
  if (kind_ != topology_kind::cluster || kind == reply_error::other || kind == reply_error::oom) return false;
  if (kind == reply_error::tryagain || kind == reply_error::clusterdown) {
    if (kind == reply_error::clusterdown) request_refresh();
    ++o->retries;
    retries_.fetch_add(1, std::memory_order_relaxed);
    retry_later(o);
    return true;
  }
  if (o->redirects >= max_redirects) return false;
  ++o->redirects;
  switch (kind) {
    case reply_error::moved:
    case reply_error::ask: {
      auto to = parse_redirection(msg, host_of(n.address));
      node* target = to ? node_at(to->address) : nullptr;
      if (target == nullptr) return false;
      redirections_.fetch_add(1, std::memory_order_relaxed);
      if (kind == reply_error::moved) {
        // The slot lives there now; the rest of the map may have moved too.
        topology_.moved(to->slot, *target);
        request_refresh();
      }
      send_to(*target, o, kind == reply_error::ask);
      return true;
    }
    case reply_error::readonly:
      // A replica: an old master after a failover. Where its slots went, the next map says.
      redirections_.fetch_add(1, std::memory_order_relaxed);
      await_map(o);
      return true;
    default: return false;
  }
}

// TRYAGAIN or CLUSTERDOWN: the slot's master after 1, 2, 4, 8, then every 16 ms, until the deadline.
void engine::retry_later(const op_ptr& o) {
  const auto wait = std::chrono::milliseconds(1 << std::min(o->retries - 1, 4));
  auto timer = std::make_shared<asio::steady_timer>(strand_, wait);
  timer->async_wait(asio::bind_executor(strand_, [self = shared_from_this(), o, timer](boost::system::error_code) {
    if (self->stopping_) return;
    self->dispatch(o);
  }));
}

}  // namespace sluice::detail
