// SPDX-License-Identifier: Apache-2.0
// The check's path through the Redis backend (engine.hpp): accepted on the caller's thread, then on
// the strand routed (the topology: slot_routing.cpp), sent (script_send.cpp), answered — or failed
// and decided by on_error — within its deadline.
#include "redis/engine.hpp"

#include <hiredis/hiredis.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>
#include <future>

#include "core/log_value.hpp"
#include "redis/scripts.hpp"
#include "redis/slot.hpp"

namespace sluice::detail {

engine::engine(const redis_options& o, std::vector<endpoint> seeds, topology_kind t,
               std::shared_ptr<const tls_settings> tls, asio::io_context& io, std::shared_ptr<memory_backend> local)
    : options_(o),
      kind_(t),
      seeds_(std::move(seeds)),
      io_(io),
      tls_(std::move(tls)),
      strand_(asio::make_strand(io)),
      deadline_timer_(strand_),
      local_(std::move(local)),
      log_(o.error_log_interval),
      topology_(t),
      refresh_timer_(strand_),
      leases_(*this, strand_, options_) {
  if (t == topology_kind::one_server) topology_.serve_all(make_node(seeds_.front()));
}

void engine::follow(const std::shared_ptr<engine>& leader) {
  leader_ = leader;
  leader->followers_.push_back(weak_from_this());
}

void engine::start() {
  asio::post(strand_, [self = shared_from_this()] {
    if (self->kind_ == topology_kind::one_server) return self->topology_.only()->connect();
    if (self->leader_) return;  // the leader's first map (its first master) starts it
    if (self->kind_ == topology_kind::sentinel) {
      // Its callback runs on the strand before do_shutdown stops it: `this` is alive.
      self->sentinel_ = std::make_shared<sentinel_watch>(self->strand_, self->seeds_, self->options_, self->tls_,
                                                         [e = self.get()](const endpoint& m) { e->on_master(m); });
      return self->sentinel_->start();
    }
    self->start_refresh();  // connects the seeds; the first to answer is asked for the map
  });
}

void engine::shutdown() {
  if (strand_.running_in_this_thread() || io_.stopped()) {
    // On a stopped io_context nothing runs the strand, nor can anything run on it meanwhile
    // (destroying the backend while another thread restarts the io_context is not allowed):
    // shut down right here, or the connections and their sockets would never be freed.
    do_shutdown();
    return;
  }
  auto done = std::make_shared<std::promise<void>>();
  auto f = done->get_future();
  asio::post(strand_, [self = shared_from_this(), done] {
    self->do_shutdown();
    done->set_value();
  });
  f.wait();
}

// What prepare() makes, the local fallback's own prepared form of the rule (which keeps the
// fallback's state for as long as the prepared rule is held), and a leased rule's lease table,
// registered for the sweeps and metrics.
result<std::shared_ptr<redis_prepared_rule>> engine::prepare(const rule& r, const backend* owner) {
  auto p = prepare_script(r, owner);
  if (!p) return p;
  if (local_) {
    auto l = local_->prepare(r);
    if (!l) return l.error();
    (*p)->local = std::move(*l);
  }
  if (r.lease) {
    (*p)->leases = leases().add(r, (*p)->call);
    (*p)->give_back_to = weak_from_this();
  }
  return p;
}

redis_prepared_rule::~redis_prepared_rule() {
  if (!leases) return;
  if (auto e = give_back_to.lock()) e->leases().return_leases(std::move(leases));
}

result<std::shared_ptr<redis_prepared_rule>> engine::prepare_script(const rule& r, const backend* owner) {
  auto call = detail::prepare_script(r);
  if (!call) return call.error();
  auto p = std::make_shared<redis_prepared_rule>(r, owner);
  p->call = std::move(*call);
  return p;
}

// The request is valid (backend::async_check) and its rule prepared here.
void engine::async_check(const check_request& req, check_handler handler) {
  const redis_prepared_rule& prepared = prepared_of(req);
  checks_.fetch_add(1, std::memory_order_relaxed);
  // A look takes no lease: Redis holds the key's state (units leased out count as used).
  if (prepared.leases && req.cost != 0) {
    prepared.leases->counters().checks.fetch_add(1, std::memory_order_relaxed);
    return leases().check(req, prepared, std::move(handler));
  }
  send_check(req, &prepared, std::move(handler));
}

void engine::async_reset(const check_request& req, reset_handler handler) {
  const redis_prepared_rule& prepared = prepared_of(req);
  if (prepared.leases && (!prepared.call.dual || req.user.empty())) {
    prepared.leases->forget(prepared.call.dual ? req.tenant : req.key);
  }
  pending_.fetch_add(1, std::memory_order_relaxed);
  auto o = std::make_shared<op>();
  o->req = req;
  o->rule = &prepared;
  o->reset = true;
  o->alone = true;
  o->handler = [h = std::move(handler)](result<decision> r) { h(r ? result<void>{} : result<void>(r.error())); };
  o->call = reset_command(prepared.call, prepared.definition(), req, options_.key_prefix, now_us());
  asio::post(strand_, [self = shared_from_this(), o = std::move(o)]() mutable { self->submit(std::move(o)); });
}

// A check sent to Redis alone (or in a batch): its op made and posted to the strand.
void engine::send_check(const check_request& req, const redis_prepared_rule* prepared, check_handler handler) {
  if (pending_.fetch_add(1, std::memory_order_relaxed) >= options_.max_pending) {
    pending_.fetch_sub(1, std::memory_order_relaxed);
    overloaded_.fetch_add(1, std::memory_order_relaxed);
    if (std::uint64_t n = log_.occurred()) {
      spdlog::warn("event=redis_overloaded max_pending={} errors={} message=\"too many checks waiting\"",
                   options_.max_pending, n);
    }
    handler(failure_decision(req, *prepared));
    return;
  }
  auto o = std::make_shared<op>();
  o->req = req;
  o->rule = prepared;
  o->handler = std::move(handler);
  // The deadline is set when it is sent.
  o->call = evalsha_command(prepared->call, prepared->definition(), o->req, options_.key_prefix, now_us(), -1);
  asio::post(strand_, [self = shared_from_this(), o = std::move(o)]() mutable { self->submit(std::move(o)); });
}

std::size_t op::script() const {
  if (reset) return reset_script;
  if (lease) return lease->script();
  return all ? all_script : rule->call.script;
}

// A call's `now`: a test clock's goes in the call; otherwise -1, and the script reads TIME.
std::int64_t engine::now_us() const {
  return options_.clock_for_test ? to_ns(options_.clock_for_test->now()) / 1000 : -1;
}

// Each check's command built; then one op per slot (one on a single Redis), each deciding its checks
// as one. The checks are valid (backend::async_check_all) and their rules prepared here.
void engine::async_check_all(std::span<const check_request> checks, check_all_handler handler) {
  if (checks.size() == 1 && !exceeds_capacity(checks[0])) {
    // All or nothing over one check is that check: sent as one (never leased, as check_all is
    // not), it goes in a batch as any other check, its rule's parameters shared.
    checks_.fetch_add(1, std::memory_order_relaxed);
    return send_check(checks[0], &prepared_of(checks[0]), [h = std::move(handler)](result<decision> r) {
      if (!r) return h(r.error());
      h(std::vector<decision>{*r});
    });
  }
  auto call = std::make_shared<all_call>();
  call->reqs.assign(checks.begin(), checks.end());
  call->handler = std::move(handler);
  call->out.resize(checks.size());
  bool record = true;
  for (const check_request& req : checks) {
    call->rules.push_back(&prepared_of(req));
    call->never.push_back(exceeds_capacity(req));
    record = record && !call->never.back();
  }
  const std::int64_t now = now_us();
  std::vector<command> commands;
  for (std::size_t i = 0; i < checks.size(); ++i) {
    check_request req = checks[i];
    if (call->never[i]) req.cost = 1;
    const redis_prepared_rule& r = *call->rules[i];
    commands.push_back(evalsha_command(r.call, r.definition(), req, options_.key_prefix, now, -1));
  }
  // The parts, by slot in the order of their first check (a single Redis: slot 0 for all).
  std::vector<std::vector<std::size_t>> parts;
  for (std::size_t i = 0; i < checks.size(); ++i) {
    auto same_slot = [&](const std::vector<std::size_t>& p) {
      return !topology_.one_slot_a_call() || commands[p.front()].slot == commands[i].slot;
    };
    auto it = std::find_if(parts.begin(), parts.end(), same_slot);
    if (it == parts.end()) {
      parts.push_back({i});
    } else {
      it->push_back(i);
    }
  }
  // No one script sees the keys of several slots: each is first only looked at, and all record
  // only when every check would admit (complete_part sends that second round). A refusal then
  // consumes nothing, unless another call takes a unit between the two rounds.
  const bool two_rounds = record && parts.size() > 1;
  call->looking = two_rounds;
  call->parts_left = parts.size();
  checks_.fetch_add(checks.size(), std::memory_order_relaxed);
  std::vector<command> calls;
  for (const auto& part : parts) {
    std::vector<command> mine;
    std::vector<std::size_t> scripts_of;
    for (std::size_t i : part) {
      mine.push_back(std::move(commands[i]));
      scripts_of.push_back(call->rules[i]->call.script);
    }
    calls.push_back(all_command(mine, scripts_of, record && !two_rounds));
  }
  if (two_rounds) {
    call->part_calls = calls;
    call->part_checks = parts;
  }
  for (std::size_t p = 0; p < parts.size(); ++p) submit_part(call, std::move(calls[p]), std::move(parts[p]));
}

void engine::submit_part(const std::shared_ptr<all_call>& call, command c, std::vector<std::size_t> part) {
  auto o = std::make_shared<op>();
  o->all = call;
  o->call = std::move(c);
  o->part = std::move(part);
  if (pending_.fetch_add(1, std::memory_order_relaxed) >= options_.max_pending) {
    overloaded_.fetch_add(1, std::memory_order_relaxed);
    complete_part(o, part_failure(*o));
    return;
  }
  asio::post(strand_, [self = shared_from_this(), o = std::move(o)]() mutable { self->submit(std::move(o)); });
}

redis_backend_stats engine::stats() const {
  redis_backend_stats s;
  s.checks = checks_.load(std::memory_order_relaxed);
  s.redis_decisions = redis_decisions_.load(std::memory_order_relaxed);
  s.calls = node_counters_.calls.load(std::memory_order_relaxed);
  s.timeouts = timeouts_.load(std::memory_order_relaxed);
  s.unavailable = unavailable_.load(std::memory_order_relaxed);
  s.protocol_errors = protocol_errors_.load(std::memory_order_relaxed);
  s.overloaded = overloaded_.load(std::memory_order_relaxed);
  s.fail_open = fail_open_.load(std::memory_order_relaxed);
  s.fail_closed = fail_closed_.load(std::memory_order_relaxed);
  s.local_fallback = local_fallback_.load(std::memory_order_relaxed);
  s.script_reloads = node_counters_.script_reloads.load(std::memory_order_relaxed);
  s.connects = node_counters_.connects.load(std::memory_order_relaxed);
  s.circuit_opens = node_counters_.circuit_opens.load(std::memory_order_relaxed);
  s.redirections = redirections_.load(std::memory_order_relaxed);
  s.retries = retries_.load(std::memory_order_relaxed);
  s.topology_refreshes = topology_refreshes_.load(std::memory_order_relaxed);
  s.masters = masters_.load(std::memory_order_relaxed);
  s.master_switches = master_switches_.load(std::memory_order_relaxed);
  s.pending = pending_.load(std::memory_order_relaxed);
  s.circuit_open = node_counters_.open_circuits.load(std::memory_order_relaxed) > 0;
  s.out_of_memory = out_of_memory_.load(std::memory_order_relaxed);
  return s;
}

void engine::submit(op_ptr o) {
  if (stopping_) return fail(o, errc::backend_unavailable, "backend is shutting down");
  o->deadline = steady::now() + options_.command_timeout;
  inflight_.push_back(o);
  arm_deadline();
  dispatch(o);
}

// To the node serving the check: the one server, or its slot's master (else it waits for the map).
void engine::dispatch(const op_ptr& o) {
  if (o->done) return;
  node* n = route(*o);
  if (n == nullptr) return await_map(o);
  send_to(*n, o, false);
}

void engine::complete(const op_ptr& o, result<decision> r) {
  o->done = true;
  // A look's script evaluated one unit and recorded nothing (scripts.cpp).
  if (o->req.cost == 0 && !o->reset && r && r->source == decision_source::limiter) *r = looked(*r);
  check_handler h = std::move(o->handler);
  pending_.fetch_sub(1, std::memory_order_relaxed);
  h(std::move(r));
}

void engine::fail(const op_ptr& o, errc code, std::string_view why) {
  if (o->done) return;
  switch (code) {
    case errc::backend_timeout: timeouts_.fetch_add(1, std::memory_order_relaxed); break;
    case errc::backend_protocol: protocol_errors_.fetch_add(1, std::memory_order_relaxed); break;
    default: unavailable_.fetch_add(1, std::memory_order_relaxed); break;
  }
  if (!stopping_) {
    if (std::uint64_t n = log_.occurred()) {
      spdlog::warn("event=redis_check_failed error={} errors={}", log_value(why), n);
    }
  }
  if (o->all) return complete_part(o, part_failure(*o));
  if (o->lease) return leases_.failed(o);
  if (o->reset) return complete(o, error(code, std::string(why)));
  complete(o, failure_decision(o->req, *o->rule));
}

// A part's decisions go into the call's; the last part to finish answers the call. Thread-safe.
void engine::complete_part(const op_ptr& o, result<std::vector<decision>> r) {
  o->done = true;
  pending_.fetch_sub(1, std::memory_order_relaxed);
  all_call& call = *o->all;
  check_all_handler h;
  {
    std::lock_guard lock(call.mutex);
    if (!r) {
      if (!call.failed) call.failed = r.error();
    } else {
      for (std::size_t k = 0; k < o->part.size(); ++k) {
        decision d = (*r)[k];
        const std::size_t i = o->part[k];
        if (call.never[i] && d.source == decision_source::limiter) {
          d.allowed = false;  // looked at with cost 1: no wait admits its own cost
          d.retry_after = never;
        }
        call.out[i] = d;
      }
    }
    if (--call.parts_left != 0) return;
    const bool all_admit = std::all_of(call.out.begin(), call.out.end(), [](const decision& d) { return d.allowed; });
    if (call.looking && !call.failed && all_admit) {
      call.looking = false;  // every slot would admit: now each records
      call.parts_left = call.part_calls.size();
    } else {
      h = std::move(call.handler);
    }
  }
  if (!h) {
    const std::shared_ptr<all_call> held = o->all;
    for (std::size_t p = 0; p < held->part_calls.size(); ++p) {
      command c = held->part_calls[p];
      set_record(c);
      submit_part(held, std::move(c), held->part_checks[p]);
    }
    return;
  }
  if (call.failed) return h(*call.failed);
  h(std::move(call.out));
}

// What on_error decides for a part Redis could not answer: the local fallback decides its checks as
// one, as Redis would have. Thread-safe.
result<std::vector<decision>> engine::part_failure(const op& o) {
  const all_call& call = *o.all;
  if (options_.on_error == failure_policy::local) {
    std::vector<check_request> local;
    for (std::size_t i : o.part) {
      check_request r = call.reqs[i];
      r.rule = call.rules[i]->local.get();
      local.push_back(r);
    }
    local_fallback_.fetch_add(o.part.size(), std::memory_order_relaxed);
    auto l = local_->check_all(local);
    if (l) {
      for (decision& d : *l) d.source = decision_source::local_fallback;
    }
    return l;
  }
  std::vector<decision> out;
  for (std::size_t i : o.part) {
    auto d = failure_decision(call.reqs[i], *call.rules[i]);
    if (!d) return d.error();
    out.push_back(*d);
  }
  return out;
}

// What on_error decides for a check Redis could not answer. Thread-safe.
result<decision> engine::failure_decision(const check_request& req, const redis_prepared_rule& prepared) {
  const rule& r = req.definition();
  switch (options_.on_error) {
    case failure_policy::allow:
      fail_open_.fetch_add(1, std::memory_order_relaxed);
      return full_capacity_decision(r, decision_source::fail_open);
    case failure_policy::deny: {
      fail_closed_.fetch_add(1, std::memory_order_relaxed);
      decision d;
      d.limit = r.limit.capacity();
      if (r.is_dual_layer()) {
        d.dual_layer = true;
        d.user.limit = r.limit.capacity();
        d.tenant.limit = r.tenant->capacity();
      }
      d.retry_after = std::chrono::seconds(1);
      d.source = decision_source::fail_closed;
      return d;
    }
    case failure_policy::local: {
      local_fallback_.fetch_add(1, std::memory_order_relaxed);
      check_request local_req = req;
      local_req.rule = prepared.local.get();
      auto l = local_->check(local_req);
      if (l) l->source = decision_source::local_fallback;
      return l;
    }
  }
  return error(errc::backend_unavailable, "no failure policy");
}

void engine::trim_inflight() {
  while (!inflight_.empty() && inflight_.front()->done) inflight_.pop_front();
}

// One timer for all checks: they share one timeout, so inflight_ is in deadline order.
void engine::arm_deadline() {
  trim_inflight();
  if (inflight_.empty() || deadline_armed_) return;
  deadline_armed_ = true;
  deadline_timer_.expires_at(inflight_.front()->deadline);
  deadline_timer_.async_wait(asio::bind_executor(strand_, [self = shared_from_this()](boost::system::error_code) {
    self->deadline_armed_ = false;
    if (self->stopping_) return;
    self->expire_due();
  }));
}

void engine::expire_due() {
  const auto now = steady::now();
  std::vector<op_ptr> expired;
  while (!inflight_.empty()) {
    op_ptr o = inflight_.front();
    if (!o->done && o->deadline > now) break;
    inflight_.pop_front();
    if (!o->done) expired.push_back(std::move(o));
  }
  // Each node's breaker counts the checks it did not answer in time.
  std::vector<std::pair<node*, std::size_t>> unanswered;
  for (const auto& o : expired) {
    if (o->sent_to == nullptr) continue;  // waiting for a route or a retry: no node's fault
    auto it = std::find_if(unanswered.begin(), unanswered.end(), [&](const auto& e) { return e.first == o->sent_to; });
    if (it == unanswered.end()) {
      unanswered.emplace_back(o->sent_to, 1);
    } else {
      ++it->second;
    }
  }
  // Before completing: a caller woken by this timeout already sees the circuit open.
  for (auto [n, count] : unanswered) n->failed(count);
  for (const auto& o : expired) fail(o, errc::backend_timeout, "no reply within command_timeout");
  std::erase_if(awaiting_map_, [](const op_ptr& o) { return o->done; });
  arm_deadline();
}

void engine::do_shutdown() {
  if (stopping_) return;
  stopping_ = true;
  deadline_timer_.cancel();
  refresh_timer_.cancel();
  leases_.stop();
  if (sentinel_) sentinel_->stop();
  for (const node_ptr& n : topology_.take_all()) n->close();  // waiting checks complete with "unavailable"
  for (auto& o : inflight_) fail(o, errc::backend_unavailable, "backend is shutting down");
  inflight_.clear();
  awaiting_map_.clear();
}

}  // namespace sluice::detail
