// SPDX-License-Identifier: Apache-2.0
// A leased rule's checks through the Redis backend (lease_client.hpp): answered from the key's lease
// where it can, else by one call that takes the lease; the calls that refill leases ahead of need
// and give back what a lease did not use.
#include "redis/lease_client.hpp"

#include <hiredis/hiredis.h>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>
#include <future>

#include "redis/engine.hpp"
#include "redis/scripts.hpp"
#include "sluice/prometheus.hpp"

namespace sluice::detail {
namespace {

void ignore(result<decision>) {}

// The request naming only the leased layer's key (a refill's, a give-back's).
check_request leased_key_request(const lease_table& t, const std::string& key) {
  check_request req;  // the commands take the rule from the table
  (t.script().dual ? req.tenant : req.key) = key;
  return req;
}

}  // namespace

std::size_t lease_call::script() const {
  switch (what) {
    case kind::take: return table->script().dual ? lease_dual_script : lease_script;
    case kind::refill: return lease_script;  // the leased layer alone
    case kind::user_layer: return table->script().user_script;
    case kind::give_back: return give_back_script;
  }
  return lease_script;
}

lease_client::lease_client(engine& through, const strand_type& strand, const redis_options& o)
    : engine_(through), strand_(strand), options_(o), timer_(strand) {}

std::shared_ptr<lease_table> lease_client::add(const rule& r, const prepared_script& call) {
  std::lock_guard lock(mutex_);
  std::shared_ptr<lease_counters>& counters = counters_[r.name];
  if (!counters) counters = std::make_shared<lease_counters>();
  auto table = std::make_shared<lease_table>(r, call, max_leased_keys, counters);
  std::erase_if(tables_, [](const auto& t) { return t.expired(); });
  tables_.push_back(table);
  asio::post(strand_, [e = engine_.shared_from_this(), this] { arm_timer(); });
  return table;
}

void lease_client::stop() { timer_.cancel(); }

std::int64_t lease_client::local_ns() const {
  if (options_.clock_for_test) return to_ns(options_.clock_for_test->now());
  return std::chrono::duration_cast<std::chrono::nanoseconds>(steady::now().time_since_epoch()).count();
}

// Any thread. What the key's lease says, done: answered here, sent, or left waiting for the call
// in flight (which resumes it).
void lease_client::check(const check_request& req, const redis_prepared_rule& p, check_handler handler, bool resumed) {
  lease_table& table = *p.leases;
  const bool dual = p.call.dual;
  const std::string_view key = dual ? req.tenant : req.key;
  const std::int64_t now = local_ns();
  struct context {
    lease_client* self;
    const check_request* req;
    const redis_prepared_rule* p;
    check_handler* handler;
  } ctx{this, &req, &p, &handler};
  // One pointer captured: no allocation unless the check does wait.
  const std::function<lease_waiter()> make_waiter = [&ctx]() -> lease_waiter {
    // The engine held: this client is its member.
    return [e = ctx.self->engine_.shared_from_this(), self = ctx.self, req = *ctx.req, p = ctx.p,
            handler = std::move(*ctx.handler)](bool failed) mutable {
      if (failed) return handler(e->failure_decision(req, *p));
      self->check(req, *p, std::move(handler), true);
    };
  };
  lease_plan plan = table.check(key, req.cost, now, make_waiter, resumed);
  switch (plan.what) {
    case lease_plan::step::wait: return;
    case lease_plan::step::exact:
      table.counters().redis_calls.fetch_add(1, std::memory_order_relaxed);
      return engine_.send_check(req, &p, std::move(handler));
    case lease_plan::step::refuse: {
      decision d = plan.leased;
      if (dual) {
        // The user layer is not asked: it reports its limit, as unchecked.
        const std::int64_t user = p.definition().limit.capacity();
        d = combine_layers(d, {.allowed = true, .limit = user, .remaining = user});
      }
      return handler(d);
    }
    case lease_plan::step::take: {
      auto call = std::make_shared<lease_call>(lease_call::kind::take, p.leases, key, now);
      call->cost = req.cost;
      call->want = plan.want;
      command c = lease_command(p.call, p.definition(), req, options_.key_prefix, engine_.now_us(), req.cost, plan.want,
                                table.hold_ns());
      send(std::move(call), std::move(c), req, &p, std::move(handler));
      return;
    }
    case lease_plan::step::admit: break;
  }
  if (plan.refill > 0) {
    auto call = std::make_shared<lease_call>(lease_call::kind::refill, p.leases, key, now);
    call->want = plan.refill;
    command c = lease_command(p.call, p.definition(), leased_key_request(table, call->key), options_.key_prefix,
                              engine_.now_us(), 0, plan.refill, table.hold_ns());
    send(std::move(call), std::move(c), {}, nullptr, ignore);
  }
  if (!dual) return handler(plan.leased);
  // The tenant's units came from the lease; the user layer is exact, and its refusal puts them back.
  auto call = std::make_shared<lease_call>(lease_call::kind::user_layer, p.leases, key, now);
  call->cost = req.cost;
  call->tenant = plan.leased;
  call->reserved = plan.reservation;
  command c = user_layer_command(p.call, p.definition(), req, options_.key_prefix, engine_.now_us());
  send(std::move(call), std::move(c), req, &p, std::move(handler));
}

// Any thread. Sends a lease's call as its own op (never batched: the batch script has no lease
// kind); `req` and `rule` are the check's (none for a refill or give-back). False when overloaded:
// it then failed at once.
bool lease_client::send(std::shared_ptr<lease_call> call, command c, const check_request& req,
                        const redis_prepared_rule* rule, check_handler handler) {
  call->table->counters().redis_calls.fetch_add(1, std::memory_order_relaxed);
  calls_.fetch_add(1, std::memory_order_relaxed);
  auto o = std::make_shared<op>();
  o->req = req;
  o->rule = rule;
  o->handler = std::move(handler);
  o->call = std::move(c);
  o->alone = true;
  o->lease = std::move(call);
  if (engine_.pending_.fetch_add(1, std::memory_order_relaxed) >= options_.max_pending) {
    engine_.overloaded_.fetch_add(1, std::memory_order_relaxed);
    failed(o);
    return false;
  }
  asio::post(strand_, [e = engine_.shared_from_this(), o = std::move(o)]() mutable { e->submit(std::move(o)); });
  return true;
}

// On the strand: a lease call's reply (not an error, not expired).
void lease_client::answered(const op_ptr& o, node& n, const redisReply& reply) {
  lease_call& l = *o->lease;
  lease_table& t = *l.table;
  switch (l.what) {
    case lease_call::kind::give_back: {
      const bool counted = reply.type == REDIS_REPLY_ARRAY && reply.elements == 2 &&
                           reply.element[0]->type == REDIS_REPLY_INTEGER && reply.element[0]->integer > 0;
      if (counted) {
        t.counters().units_returned.fetch_add(static_cast<std::uint64_t>(reply.element[0]->integer),
                                              std::memory_order_relaxed);
      }
      n.succeeded();
      engine_.complete(o, decision{});
      break;
    }
    case lease_call::kind::user_layer: {
      auto d = parse_reply(t.user_layer(), reply);
      if (!d) return engine_.failed_reply(o, n, d.error().message);
      n.succeeded();
      engine_.redis_decisions_.fetch_add(1, std::memory_order_relaxed);
      if (!d->allowed) t.undo(l.key, l.reserved, local_ns());
      engine_.complete(o, combine_layers(l.tenant, *d));
      break;
    }
    case lease_call::kind::take:
    case lease_call::kind::refill: {
      auto r = parse_lease_reply(t.script(), l.what == lease_call::kind::refill, l.cost, l.want, reply);
      if (!r) return engine_.failed_reply(o, n, r.error().message);
      n.succeeded();
      if (l.what == lease_call::kind::take) engine_.redis_decisions_.fetch_add(1, std::memory_order_relaxed);
      decision check = r->check;
      std::vector<lease_waiter> waiting =
          t.answered(l.key, {.sent_ns = l.sent_ns, .used = l.cost, .reply = *r}, local_ns());
      if (t.dropped()) {
        // Its rule was dropped while this call was in flight: what it leased goes back at once.
        for (const give_back& g : t.drain(local_ns())) send_give_back(l.table, g);
      }
      engine_.complete(o, check);
      for (lease_waiter& w : waiting) w(false);
      break;
    }
  }
  call_finished();
}

// Any thread: a lease call that Redis did not answer (or that could not be sent).
void lease_client::failed(const op_ptr& o) {
  lease_call& l = *o->lease;
  switch (l.what) {
    case lease_call::kind::give_back:
      // Its units stay counted until their window ends or their slots pass: nothing is lost.
      engine_.complete(o, decision{});
      break;
    case lease_call::kind::user_layer:
      l.table->undo(l.key, l.reserved, local_ns());
      engine_.complete(o, engine_.failure_decision(o->req, *o->rule));
      break;
    case lease_call::kind::take:
    case lease_call::kind::refill: {
      std::vector<lease_waiter> waiting = l.table->failed(l.key);
      const bool take = l.what == lease_call::kind::take;
      engine_.complete(o, take ? engine_.failure_decision(o->req, *o->rule) : decision{});
      // A failed take fails its waiters as their own calls would have; a failed refill was no
      // check's, so they ask by themselves.
      for (lease_waiter& w : waiting) w(take);
      break;
    }
  }
  call_finished();
}

// Any thread.
void lease_client::call_finished() {
  if (calls_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  asio::post(strand_, [e = engine_.shared_from_this(), this] {
    if (calls_.load(std::memory_order_acquire) != 0) return;
    auto told = std::move(when_idle_);
    when_idle_.clear();
    for (auto& f : told) f();
  });
}

std::vector<std::shared_ptr<lease_table>> lease_client::live_tables() {
  std::lock_guard lock(mutex_);
  std::vector<std::shared_ptr<lease_table>> out;
  std::erase_if(tables_, [](const std::weak_ptr<lease_table>& w) { return w.expired(); });
  for (const auto& w : tables_) {
    if (auto t = w.lock()) out.push_back(std::move(t));
  }
  return out;
}

// On the strand.
void lease_client::send_give_back(const std::shared_ptr<lease_table>& table, const give_back& g) {
  auto call = std::make_shared<lease_call>(lease_call::kind::give_back, table, g.key, local_ns());
  command c = give_back_command(table->script(), table->definition(), leased_key_request(*table, call->key),
                                options_.key_prefix, engine_.now_us(), g.token, g.units);
  send(std::move(call), std::move(c), {}, nullptr, ignore);
}

// On the strand: gives back what the leases of keys idle for a period hold; `when_idle` (if any)
// is told once no lease call is in flight.
void lease_client::sweep_now(std::function<void()> when_idle) {
  if (!engine_.stopping_) {
    const std::int64_t now = local_ns();
    for (const auto& t : live_tables()) {
      for (const give_back& g : t->expire(now)) send_give_back(t, g);
    }
  }
  if (when_idle) after_calls(std::move(when_idle));
}

// On the strand: `f` now if no lease call is in flight, else once none is.
void lease_client::after_calls(std::function<void()> f) {
  if (calls_.load(std::memory_order_acquire) == 0) return f();
  when_idle_.push_back(std::move(f));
}

void lease_client::give_back_leases() {
  auto e = engine_.shared_from_this();
  if (e->on_io_thread()) {
    asio::post(strand_, [e, this] { sweep_now(nullptr); });
    return;
  }
  // Once the calls in flight are answered (a refill's units are then in its lease), and again
  // once the give-backs are.
  auto answered = std::make_shared<std::promise<void>>();
  auto f = answered->get_future();
  asio::post(strand_, [e, this, answered] {
    after_calls([this, answered] { sweep_now([answered] { answered->set_value(); }); });
  });
  f.wait_for(options_.command_timeout + std::chrono::seconds(1));
}

void lease_client::return_leases(std::shared_ptr<lease_table> table) {
  asio::post(strand_, [e = engine_.shared_from_this(), this, table = std::move(table)] {
    if (engine_.stopping_) return;
    for (const give_back& g : table->drain(local_ns())) send_give_back(table, g);
  });
}

// On the strand: while leased rules exist, their ended leases are given back every sweep interval.
void lease_client::arm_timer() {
  if (timer_armed_ || engine_.stopping_) return;
  timer_armed_ = true;
  timer_.expires_after(lease_sweep_interval);
  timer_.async_wait(asio::bind_executor(strand_, [e = engine_.shared_from_this(), this](boost::system::error_code ec) {
    timer_armed_ = false;
    if (ec || engine_.stopping_) return;
    sweep_now(nullptr);
    if (!live_tables().empty()) arm_timer();
  }));
}

void lease_client::append_metrics(std::string& out) const {
  std::lock_guard lock(mutex_);
  if (counters_.empty()) return;
  const auto family = [&](const char* name, const char* help, std::atomic<std::uint64_t> lease_counters::*field) {
    prometheus::family(out, name, "counter", help);
    for (const auto& [rule, c] : counters_) {
      prometheus::sample(out, std::string(name) + "{rule=\"" + prometheus::escape_label(rule) + "\"}",
                         ((*c).*field).load(std::memory_order_relaxed));
    }
  };
  family("sluice_lease_checks_total", "Checks of leased rules.", &lease_counters::checks);
  family("sluice_lease_redis_calls_total", "Redis calls leased rules cost (divide by checks: calls per check).",
         &lease_counters::redis_calls);
  family("sluice_lease_local_admits_total", "Checks admitted from a lease, without a call for the leased layer.",
         &lease_counters::local_admits);
  family("sluice_lease_local_refusals_total", "Checks refused from a remembered refusal, without a call.",
         &lease_counters::local_refusals);
  family("sluice_lease_leases_total", "Lease calls that leased units.", &lease_counters::leases);
  family("sluice_lease_units_leased_total", "Units leased.", &lease_counters::units_leased);
  family("sluice_lease_units_returned_total", "Unused units given back.", &lease_counters::units_returned);
}

}  // namespace sluice::detail
