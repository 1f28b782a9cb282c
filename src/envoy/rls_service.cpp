#include "envoy/rls_service.hpp"

#include <algorithm>
#include <atomic>
#include <optional>
#include <set>

#include <spdlog/spdlog.h>

#include "core/log_value.hpp"
#include "sluice/prometheus.hpp"

namespace sluice::envoy {
namespace {

using code = pb::RateLimitResponse::Code;

grpc::Status invalid(std::string message) { return {grpc::StatusCode::INVALID_ARGUMENT, std::move(message)}; }

// The one mapping from a check's error to the call's status.
grpc::Status status_of(const error& e) {
  if (e.code == condition::invalid_request) return invalid(e.message);
  if (e == errc::capacity_exhausted) return {grpc::StatusCode::RESOURCE_EXHAUSTED, e.message};
  return {grpc::StatusCode::UNAVAILABLE, e.message};
}

std::uint32_t as_uint32(std::int64_t v) {
  return static_cast<std::uint32_t>(std::clamp<std::int64_t>(v, 0, UINT32_MAX));
}

}  // namespace

// A request's own limit (RateLimitDescriptor.limit), prepared over its (domain, unit)'s state.
struct rls_service::override_limit {
  rls_limit limit;
  prepared_rule_ptr prepared;
  descriptor_counters* counters = nullptr;  // its domain's overrides'
};

// One request on its way: its checks, and what answers it when the backend has decided them.
struct rls_service::call {
  struct applied {
    int descriptor;
    const rls_limit* limit;
    const rls_node* node;           // null for an override
    descriptor_counters* counters;  // its node's, or its domain's overrides
    bool shadow;                    // shadow_mode, or a look (below): decided on its own, never refuses
    bool look;                      // hits_addend 0: the counter looked at, nothing counted (as the reference)
    std::size_t check;              // in `enforcing` or `shadow`
  };

  const pb::RateLimitRequest* req = nullptr;
  pb::RateLimitResponse* resp = nullptr;
  done_handler done;
  std::shared_ptr<const rls_rules> rules;  // holds the prepared rules the checks use
  std::vector<std::shared_ptr<const override_limit>> overrides;
  std::vector<std::string> keys;    // per descriptor
  std::vector<std::uint64_t> hits;  // per descriptor
  std::vector<bool> unlimited;      // per descriptor: an unlimited limit applies
  std::vector<applied> limits;
  std::vector<check_request> enforcing, shadow;
  std::vector<decision> enforcing_out, shadow_out;
  bool unknown_domain = false;  // no config defines the request's domain: nothing applies
  std::atomic<int> waiting{0};
  std::mutex mutex;
  std::optional<error> failed;  // guarded by mutex

  void fail(const error& e) {
    std::lock_guard lock(mutex);
    if (!failed) failed = e;
  }
};

rls_service::rls_service(backend& b, rls_options o)
    : backend_(b), options_(std::move(o)), counters_(options_.max_detailed_labels) {}

rls_service::~rls_service() = default;

void rls_service::decide(const pb::RateLimitRequest& req, pb::RateLimitResponse& resp, done_handler done) {
  auto reject = [&](grpc::Status s) {
    invalid_.fetch_add(1, std::memory_order_relaxed);
    done(std::move(s));
  };
  if (req.domain().empty()) return reject(invalid("domain must not be empty"));
  if (req.domain().size() > max_key_length) return reject(invalid("domain is longer than 512 bytes"));
  if (req.descriptors_size() == 0) return reject(invalid("a request needs at least one descriptor"));
  if (req.descriptors_size() > max_descriptors)
    return reject(invalid("a request has at most " + std::to_string(max_descriptors) + " descriptors"));

  auto c = std::make_shared<call>();
  c->req = &req;
  c->resp = &resp;
  thread_local published<rls_rules>::view rules_view;  // each io thread's: no lock per call
  c->rules = rules_.read(rules_view);
  const rls_domain* domain = c->rules ? c->rules->find(req.domain()) : nullptr;
  const int n = req.descriptors_size();
  c->keys.resize(static_cast<std::size_t>(n));
  c->hits.resize(static_cast<std::size_t>(n));
  c->unlimited.assign(static_cast<std::size_t>(n), false);
  std::vector<entry> entries;
  for (int i = 0; i < n; ++i) {
    const auto& d = req.descriptors(i);
    const std::string which = "descriptor " + std::to_string(i);
    if (d.entries_size() == 0) continue;  // no entries: no limit applies, OK (as the reference answers)
    if (d.entries_size() > max_entries)
      return reject(invalid(which + " has more than " + std::to_string(max_entries) + " entries"));
    entries.clear();
    std::string& key = c->keys[static_cast<std::size_t>(i)];
    for (const auto& e : d.entries()) {
      if (e.key().empty()) return reject(invalid(which + " has an entry with an empty key"));
      entries.push_back({e.key(), e.value()});
      // Each length-prefixed: no value can make two descriptors share a counter.
      detail::append_counted(key, e.key());
      detail::append_counted(key, e.value());
    }
    if (key.size() > max_key_length) return reject(invalid(which + ": its entries are longer than 512 bytes"));
    std::uint64_t hits = req.hits_addend() == 0 ? 1 : req.hits_addend();
    if (d.has_hits_addend()) hits = d.hits_addend().value();  // 0: look, count nothing
    if (hits > max_hits)
      return reject(invalid(which + ": hits_addend must be at most 4294967295, got " + std::to_string(hits)));
    c->hits[static_cast<std::size_t>(i)] = hits;
    if (domain == nullptr) continue;  // an unknown domain limits nothing
    if (d.has_limit()) {
      grpc::Status s;
      auto o = override_for(req.domain(), d.limit().requests_per_unit(), d.limit().unit(), s);
      if (!o) return reject(s);
      c->limits.push_back({i, &o->limit, nullptr, o->counters, hits == 0, hits == 0, 0});
      c->overrides.push_back(std::move(o));
      continue;
    }
    if (const rls_node* node = c->rules->match(*domain, entries)) {
      for (const rls_limit& l : node->limits)
        c->limits.push_back({i, &l, node, node->counters, node->shadow_mode || hits == 0, hits == 0, 0});
    }
  }
  if (domain == nullptr) {
    c->unknown_domain = true;
    note_unknown_domain(req.domain());
  }

  // A limit named in another's `replaces` does not apply to this request.
  std::set<std::string_view> replaced;
  for (const auto& a : c->limits) replaced.insert(a.limit->config.replaces.begin(), a.limit->config.replaces.end());
  std::erase_if(c->limits, [&](const call::applied& a) {
    const std::string& name = a.limit->config.name;
    return !name.empty() && replaced.contains(name);
  });
  std::erase_if(c->limits, [&](const call::applied& a) {
    if (!a.limit->config.unlimited) return false;
    c->unlimited[static_cast<std::size_t>(a.descriptor)] = true;
    return true;
  });

  // One check per rule and counter key: two descriptors asking for one counter ask for their sum
  // (under the tighter limit, when two overrides of one unit differ). A look asks for a cost no
  // wait admits, so that the backend only looks; looks go last, so that no other check joins one.
  for (const bool looks : {false, true}) {
    for (auto& a : c->limits) {
      if (a.look != looks) continue;
      auto& checks = a.shadow ? c->shadow : c->enforcing;
      const std::string& key = c->keys[static_cast<std::size_t>(a.descriptor)];
      const prepared_rule& rule = *a.limit->prepared;
      const std::int64_t cost = a.look ? std::max<std::int64_t>(rule.definition().limit.capacity(), 0) + 1
                                       : static_cast<std::int64_t>(c->hits[static_cast<std::size_t>(a.descriptor)]);
      auto same = a.look ? checks.end() : std::find_if(checks.begin(), checks.end(), [&](const check_request& r) {
        return r.definition().name == rule.definition().name && r.key == key;
      });
      if (same != checks.end()) {
        same->cost += cost;
        if (rule.definition().limit.capacity() < same->definition().limit.capacity()) same->rule = &rule;
        a.check = static_cast<std::size_t>(same - checks.begin());
        continue;
      }
      if (checks.size() == max_checks_per_call)
        return reject(invalid("more than " + std::to_string(max_checks_per_call) + " limits apply to one request"));
      a.check = checks.size();
      checks.push_back({.rule = &rule, .key = key, .cost = cost});
    }
  }

  c->done = std::move(done);
  // All or nothing: the enforcing checks in one call. Otherwise, and for shadow_mode descriptors,
  // each on its own (check_all of one: a cost no wait admits is refused, not an error).
  c->enforcing_out.resize(c->enforcing.size());
  c->shadow_out.resize(c->shadow.size());
  const bool together = options_.all_or_nothing && !c->enforcing.empty();
  const int calls = (together ? 1 : static_cast<int>(c->enforcing.size())) + static_cast<int>(c->shadow.size());
  if (calls == 0) return finish(*c);
  c->waiting.store(calls, std::memory_order_relaxed);
  auto part_done = [this](call& k) {
    if (k.waiting.fetch_sub(1, std::memory_order_acq_rel) == 1) finish(k);
  };
  auto each = [&](std::vector<check_request>& checks, std::vector<decision>& out) {
    for (std::size_t k = 0; k < checks.size(); ++k) {
      backend_.async_check_all(std::span(&checks[k], 1), [c, &out, k, part_done](result<std::vector<decision>> r) {
        if (r) {
          out[k] = r->front();
        } else {
          c->fail(r.error());
        }
        part_done(*c);
      });
    }
  };
  if (together) {
    backend_.async_check_all(c->enforcing, [c, part_done](result<std::vector<decision>> r) {
      if (r) {
        c->enforcing_out = std::move(*r);
      } else {
        c->fail(r.error());
      }
      part_done(*c);
    });
  } else {
    each(c->enforcing, c->enforcing_out);
  }
  each(c->shadow, c->shadow_out);
}

void rls_service::finish(call& c) {
  if (c.failed) {
    (c.failed->code == condition::invalid_request ? invalid_ : failed_).fetch_add(1, std::memory_order_relaxed);
    c.resp->Clear();
    return c.done(status_of(*c.failed));
  }
  // Per descriptor, the limit it reports: a refusing one first, else the one with least left.
  struct reported {
    const call::applied* limit = nullptr;
    decision d;
    bool refused = false;  // an enforcing limit refused
  };
  const int n = c.req->descriptors_size();
  std::vector<reported> per(static_cast<std::size_t>(n));
  for (const auto& a : c.limits) {
    const decision& d = (a.shadow ? c.shadow_out : c.enforcing_out)[a.check];
    reported& r = per[static_cast<std::size_t>(a.descriptor)];
    const bool refused = !d.allowed && !a.shadow;
    if (r.limit == nullptr || (refused && !r.refused) || (refused == r.refused && d.remaining < r.d.remaining)) {
      r = {&a, d, refused};
      if (a.look) r.d.retry_after = nanoseconds(0);  // looked at: its window's end is its reset
    }
  }
  // A descriptor's units count once, under its own path (as the reference's stats do): over the
  // limit when the limit it reports refused (in shadow_mode too), else within.
  for (int i = 0; i < n; ++i) {
    const reported& r = per[static_cast<std::size_t>(i)];
    if (r.limit == nullptr) continue;
    const call::applied& a = *r.limit;
    descriptor_counters* counters = a.counters;
    if (a.node != nullptr && a.node->detailed_metric) {
      std::string path;
      for (const auto& e : c.req->descriptors(i).entries()) {
        if (!path.empty()) path += '.';
        path += e.key();
        path += '_';
        path += e.value();
      }
      counters = &counters_.detailed(c.req->domain(), path, *a.node->counters);
    }
    const std::uint64_t hits = c.hits[static_cast<std::size_t>(i)];
    counters->hits.fetch_add(hits, std::memory_order_relaxed);
    (r.d.allowed ? counters->within_limit : counters->over_limit).fetch_add(hits, std::memory_order_relaxed);
    if (!r.d.allowed && a.shadow && !a.look) counters->shadow_mode.fetch_add(hits, std::memory_order_relaxed);
  }

  pb::RateLimitResponse& resp = *c.resp;
  bool over = false;
  const pb::RateLimitResponse::DescriptorStatus* closest = nullptr;
  const rls_limit* closest_limit = nullptr;
  for (int i = 0; i < n; ++i) {
    auto* st = resp.add_statuses();
    const reported& r = per[static_cast<std::size_t>(i)];
    st->set_code(pb::RateLimitResponse::OK);
    if (r.limit == nullptr) {
      if (c.unlimited[static_cast<std::size_t>(i)]) st->set_limit_remaining(UINT32_MAX);
      continue;
    }
    const rate_limit_config& cfg = r.limit->limit->config;
    if (r.refused) {
      st->set_code(pb::RateLimitResponse::OVER_LIMIT);
      over = true;
    }
    auto* current = st->mutable_current_limit();
    current->set_name(cfg.name);
    current->set_requests_per_unit(cfg.requests_per_unit);
    current->set_unit(static_cast<pb::RateLimitResponse::RateLimit::Unit>(cfg.unit));
    // Over the limit, nothing is left (what Envoy's headers then say), whatever a smaller cost could take.
    st->set_limit_remaining(r.refused ? 0 : as_uint32(r.d.remaining));
    const nanoseconds reset = r.d.allowed || r.limit->look ? r.d.reset_after : r.d.retry_after;
    if (reset > nanoseconds(0) && reset != never) {
      // Whole seconds, rounded up, as the reference sends them.
      constexpr std::int64_t ns_per_s = 1'000'000'000;
      st->mutable_duration_until_reset()->set_seconds((reset.count() + ns_per_s - 1) / ns_per_s);
    }
    if (closest == nullptr || st->limit_remaining() < closest->limit_remaining()) {
      closest = st;
      closest_limit = r.limit->limit;
    }
  }
  resp.set_overall_code(over ? pb::RateLimitResponse::OVER_LIMIT : pb::RateLimitResponse::OK);
  if (options_.response_headers && closest != nullptr) {
    auto header = [&](const std::string& name, std::string value) {
      auto* h = resp.add_response_headers_to_add();
      h->set_key(name);
      h->set_value(std::move(value));
    };
    const auto& reset = closest->duration_until_reset();
    header(options_.header_limit, std::to_string(closest_limit->config.requests_per_unit));
    header(options_.header_remaining, std::to_string(closest->limit_remaining()));
    header(options_.header_reset, std::to_string(reset.seconds() + (reset.nanos() > 0 ? 1 : 0)));
  }
  (over ? over_limit_ : c.unknown_domain ? unknown_domain_ : ok_).fetch_add(1, std::memory_order_relaxed);
  c.done(grpc::Status::OK);
}

// As envoyproxy/ratelimit does, a domain no config defines limits nothing — so a misspelt domain in
// Envoy's config turns limiting off: say so, once per domain, in bounded memory.
void rls_service::note_unknown_domain(const std::string& domain) {
  std::lock_guard lock(unknown_mutex_);
  if (unknown_domains_full_ || unknown_domains_.contains(domain)) return;
  if (unknown_domains_.size() == max_logged_unknown_domains) {
    unknown_domains_full_ = true;
    spdlog::warn("event=envoy_unknown_domains_not_logged max={} message=\"more unknown domains are only counted\"",
                 max_logged_unknown_domains);
    return;
  }
  unknown_domains_.insert(domain);
  spdlog::warn("event=envoy_unknown_domain domain={} message=\"no config defines this domain: answered OK, no limit\"",
               log_value(domain));
}

std::shared_ptr<const rls_service::override_limit> rls_service::override_for(const std::string& domain,
                                                                             std::uint32_t requests_per_unit,
                                                                             int unit_number, grpc::Status& status) {
  if (unit_number < 1 || unit_number > 7) {
    status = invalid("a descriptor's limit needs a unit (SECOND to WEEK), got " + std::to_string(unit_number));
    return nullptr;
  }
  const unit u = static_cast<unit>(unit_number);
  std::lock_guard lock(mutex_);
  const auto key = std::make_tuple(domain, u, requests_per_unit);
  if (auto it = overrides_.find(key); it != overrides_.end()) return it->second;
  if (overrides_.size() >= max_override_limits) overrides_.clear();  // their state lives in the bases
  std::string name = "envoy/";
  append_name_part(name, domain);
  name += "/override/";
  name += to_string(u);
  auto o = std::make_shared<override_limit>();
  o->limit.config = {.unit = u, .requests_per_unit = requests_per_unit, .where = "a request's limit"};
  result<prepared_rule_ptr> p = error(errc::invalid_argument, "");
  if (requests_per_unit == 0) {
    prepared_rule_ptr& deny = deny_rules_[domain];
    if (!deny) {
      auto made = backend_.prepare({.name = name + "/deny", .limit = o->limit.config.to_policy()});
      if (made) deny = *made;
      p = made;
    } else {
      p = deny;
    }
  } else {
    prepared_rule_ptr& base = override_bases_[{domain, u}];
    if (!base) {
      auto made = backend_.prepare({.name = name, .limit = fixed_window_policy(1, unit_length(u))});
      if (!made) {
        status = status_of(made.error());
        return nullptr;
      }
      base = *made;
    }
    p = backend_.prepare_override({.name = name, .limit = o->limit.config.to_policy()}, *base);
  }
  if (!p) {
    status = status_of(p.error());
    return nullptr;
  }
  o->prepared = std::move(*p);
  o->limit.prepared = o->prepared.get();
  o->counters = &counters_.of(domain, "(override)");
  overrides_.emplace(key, o);
  return o;
}

void rls_service::append_metrics(std::string& out) const {
  prometheus::family(out, "sluice_envoy_requests_total", "counter",
                     "ShouldRateLimit calls by outcome: ok, over_limit, unknown_domain (answered OK, no limit), "
                     "invalid (INVALID_ARGUMENT), failed.");
  prometheus::sample(out, "sluice_envoy_requests_total{code=\"ok\"}", ok_.load(std::memory_order_relaxed));
  prometheus::sample(out, "sluice_envoy_requests_total{code=\"over_limit\"}",
                     over_limit_.load(std::memory_order_relaxed));
  prometheus::sample(out, "sluice_envoy_requests_total{code=\"unknown_domain\"}",
                     unknown_domain_.load(std::memory_order_relaxed));
  prometheus::sample(out, "sluice_envoy_requests_total{code=\"invalid\"}", invalid_.load(std::memory_order_relaxed));
  prometheus::sample(out, "sluice_envoy_requests_total{code=\"failed\"}", failed_.load(std::memory_order_relaxed));
  counters_.append_metrics(out);
}

}  // namespace sluice::envoy
