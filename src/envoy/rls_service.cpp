// SPDX-License-Identifier: Apache-2.0
#include "envoy/rls_service.hpp"

#include <algorithm>
#include <atomic>
#include <optional>
#include <cmath>
#include <set>
#include <span>

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

// The stats path of a descriptor where the request's values name it — detailed_metric: every
// value; value_to_metric: those the config leaves open (a key alone, a wildcard) — with a
// share_threshold wildcard's pattern in place of the values it matched, as the reference names
// them. Empty: the node's own path.
std::string metric_path(const rls_node& node, std::span<const entry> entries, std::span<const match_step> steps) {
  bool named_by_request = node.detailed_metric;
  std::string path;
  for (std::size_t k = 0; k < entries.size(); ++k) {
    const match_step& step = steps[k];
    const bool shared = step.by == matched_by::wildcard && step.node->share_threshold;
    std::string_view value = entries[k].value;
    bool separator = node.detailed_metric;  // detailed: "key_value", the value even when empty
    if (shared) {
      value = step.node->value;
    } else if (!node.detailed_metric && step.by != matched_by::value) {
      if (step.node->value_to_metric) {
        named_by_request = true;
      } else {
        value = step.by == matched_by::wildcard ? std::string_view(step.node->value) : std::string_view();
      }
    }
    if (!path.empty()) path += '.';
    path += entries[k].key;
    if (separator || !value.empty()) {
      path += '_';
      path += value;
    }
  }
  return named_by_request ? path : std::string();
}

// A descriptor's units, counted once as the reference counts them: a request that takes the count
// past the limit adds only its units past the limit to over_limit, and those past
// near_limit_ratio of the limit to near_limit (the rest to within_limit); shadow_mode adds to
// shadow_mode what it adds to over_limit. A refused request's units count as if added (sluice
// does not add them); a look (hits 0) adds nothing.
void count_units(descriptor_counters& counters, std::int64_t hits, const decision& d, bool over, bool look, bool shadow,
                 double near_limit_ratio) {
  const std::int64_t limit = std::max<std::int64_t>(d.limit, 0);
  const std::int64_t left = std::clamp<std::int64_t>(d.remaining, 0, limit);
  const std::int64_t before = d.allowed && !look ? limit - left - hits : limit - left;
  const std::int64_t after = before + hits;
  const auto near = static_cast<std::int64_t>(std::floor(static_cast<double>(limit) * near_limit_ratio));
  auto add = [](std::atomic<std::uint64_t>& to, std::int64_t v) {
    if (v > 0) to.fetch_add(static_cast<std::uint64_t>(v), std::memory_order_relaxed);
  };
  add(counters.hits, hits);
  if (over && !look) {
    const std::int64_t past = before >= limit ? hits : after - limit;
    add(counters.over_limit, past);
    if (before < limit) add(counters.near_limit, limit - std::max(near, before));
    if (shadow) add(counters.shadow_mode, past);
    return;
  }
  add(counters.within_limit, hits);
  if (after > near) add(counters.near_limit, before >= near ? hits : after - near);
}

// "key_value.key2", the reference's stats key of a request's own limit.
std::string entries_path(std::span<const entry> entries) {
  std::string path;
  for (const entry& e : entries) {
    if (!path.empty()) path += '.';
    path += e.key;
    if (!e.value.empty()) {
      path += '_';
      path += e.value;
    }
  }
  return path;
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
    bool shadow;                    // shadow_mode: over its limit, answered OK
    bool quota;                     // quota_mode: refuses the request only with every quota descriptor
    bool look;                      // hits_addend 0: the counter looked at, nothing counted (as the reference)
    std::size_t check;              // in `enforcing` or `apart`

    bool checked_apart() const noexcept { return shadow || quota || look; }
  };

  const pb::RateLimitRequest* req = nullptr;
  pb::RateLimitResponse* resp = nullptr;
  done_handler done;
  std::shared_ptr<const rls_rules> rules;  // holds the prepared rules the checks use
  std::vector<std::shared_ptr<const override_limit>> overrides;
  std::vector<std::string> keys;          // per descriptor
  std::vector<std::string> metric_paths;  // per descriptor: named by the request's values (or empty)
  std::vector<std::uint64_t> hits;        // per descriptor
  std::vector<bool> unlimited;            // per descriptor: an unlimited limit applies
  std::vector<applied> limits;
  std::vector<check_request> enforcing, apart;  // apart: each on its own (shadow, quota, looks)
  std::vector<decision> enforcing_out, apart_out;
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
  c->metric_paths.resize(static_cast<std::size_t>(n));
  c->hits.resize(static_cast<std::size_t>(n));
  c->unlimited.assign(static_cast<std::size_t>(n), false);
  std::vector<entry> entries;
  std::vector<match_step> steps;
  for (int i = 0; i < n; ++i) {
    const auto& d = req.descriptors(i);
    const std::string which = "descriptor " + std::to_string(i);
    if (d.entries_size() == 0) continue;  // no entries: no limit applies, OK (as the reference answers)
    if (d.entries_size() > max_entries)
      return reject(invalid(which + " has more than " + std::to_string(max_entries) + " entries"));
    entries.clear();
    for (const auto& e : d.entries()) {
      if (e.key().empty()) return reject(invalid(which + " has an entry with an empty key"));
      entries.push_back({e.key(), e.value()});
    }
    std::uint64_t hits = req.hits_addend() == 0 ? 1 : req.hits_addend();
    if (d.has_hits_addend()) hits = d.hits_addend().value();  // 0: look, count nothing
    if (hits > max_hits)
      return reject(invalid(which + ": hits_addend must be at most 4294967295, got " + std::to_string(hits)));
    c->hits[static_cast<std::size_t>(i)] = hits;
    const rls_node* node = domain != nullptr && !d.has_limit() ? c->rules->match(*domain, entries, &steps) : nullptr;
    // The counter's key: each entry length-prefixed, so that no value can make two descriptors
    // share a counter — but the values a share_threshold wildcard matches share its own.
    std::string& key = c->keys[static_cast<std::size_t>(i)];
    for (std::size_t k = 0; k < entries.size(); ++k) {
      const bool shared = node != nullptr && steps[k].by == matched_by::wildcard && steps[k].node->share_threshold;
      detail::append_counted(key, entries[k].key);
      detail::append_counted(key, shared ? std::string_view(steps[k].node->value) : entries[k].value);
    }
    if (key.size() > max_key_length) return reject(invalid(which + ": its entries are longer than 512 bytes"));
    if (domain == nullptr) continue;  // an unknown domain limits nothing
    if (d.has_limit()) {
      grpc::Status s;
      auto o = override_for(req.domain(), d.limit().requests_per_unit(), d.limit().unit(), s);
      if (!o) return reject(s);
      c->metric_paths[static_cast<std::size_t>(i)] = entries_path(entries);
      c->limits.push_back({i, &o->limit, nullptr, o->counters, false, options_.quota_mode, hits == 0, 0});
      c->overrides.push_back(std::move(o));
      continue;
    }
    if (node == nullptr) continue;
    c->metric_paths[static_cast<std::size_t>(i)] = metric_path(*node, entries, steps);
    for (const rls_limit& l : node->limits) {
      c->limits.push_back(
          {i, &l, node, node->counters, node->shadow_mode, node->quota_mode || options_.quota_mode, hits == 0, 0});
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
      auto& checks = a.checked_apart() ? c->apart : c->enforcing;
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
  // All or nothing: the enforcing checks in one call. Otherwise, and for the checks that do not
  // refuse the request on their own (shadow_mode, quota_mode, looks), each on its own (check_all of
  // one: a cost no wait admits is refused, not an error).
  c->enforcing_out.resize(c->enforcing.size());
  c->apart_out.resize(c->apart.size());
  const bool together = options_.all_or_nothing && !c->enforcing.empty();
  const int calls = (together ? 1 : static_cast<int>(c->enforcing.size())) + static_cast<int>(c->apart.size());
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
  each(c->apart, c->apart_out);
}

void rls_service::finish(call& c) {
  if (c.failed) {
    (c.failed->code == condition::invalid_request ? invalid_ : failed_).fetch_add(1, std::memory_order_relaxed);
    c.resp->Clear();
    return c.done(status_of(*c.failed));
  }
  // Per descriptor, the limit it reports: one over its limit first, else the one with least left.
  // A look is over once nothing is left (sluice never counts past a limit, so "at" is as far as a
  // counter goes).
  struct reported {
    const call::applied* limit = nullptr;
    decision d;
    bool over = false;
  };
  const int n = c.req->descriptors_size();
  std::vector<reported> per(static_cast<std::size_t>(n));
  for (const auto& a : c.limits) {
    const decision& d = (a.checked_apart() ? c.apart_out : c.enforcing_out)[a.check];
    reported& r = per[static_cast<std::size_t>(a.descriptor)];
    const bool over = a.look ? d.remaining <= 0 : !d.allowed;
    if (r.limit == nullptr || (over && !r.over) || (over == r.over && d.remaining < r.d.remaining)) {
      r = {&a, d, over};
      if (a.look) r.d.retry_after = nanoseconds(0);  // looked at: its window's end is its reset
    }
  }
  // Under the descriptor's stats path: its node's, or the one its request's values name.
  for (int i = 0; i < n; ++i) {
    const reported& r = per[static_cast<std::size_t>(i)];
    if (r.limit == nullptr) continue;
    const std::string& path = c.metric_paths[static_cast<std::size_t>(i)];
    descriptor_counters& counters =
        path.empty() ? *r.limit->counters : counters_.detailed(c.req->domain(), path, *r.limit->counters);
    count_units(counters, static_cast<std::int64_t>(c.hits[static_cast<std::size_t>(i)]), r.d, r.over, r.limit->look,
                r.limit->shadow, options_.near_limit_ratio);
  }

  // OVER_LIMIT when a descriptor over its limit refuses (not in shadow_mode, not in quota_mode), or
  // when every quota_mode descriptor is over its limit (as the reference decides).
  pb::RateLimitResponse& resp = *c.resp;
  int refusing = 0, quotas = 0, quotas_over = 0;
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
    const call::applied& a = *r.limit;
    const rate_limit_config& cfg = a.limit->config;
    const bool refused = r.over && !a.shadow;
    if (refused) st->set_code(pb::RateLimitResponse::OVER_LIMIT);
    if (a.quota) {
      ++quotas;
      quotas_over += refused ? 1 : 0;
    } else {
      refusing += refused ? 1 : 0;
    }
    auto* current = st->mutable_current_limit();
    current->set_name(cfg.name);
    current->set_requests_per_unit(cfg.requests_per_unit);
    current->set_unit(static_cast<pb::RateLimitResponse::RateLimit::Unit>(cfg.unit));
    // Over the limit, nothing is left (what Envoy's headers then say), whatever a smaller cost could take.
    st->set_limit_remaining(r.over ? 0 : as_uint32(r.d.remaining));
    const nanoseconds reset = r.d.allowed || a.look ? r.d.reset_after : r.d.retry_after;
    if (reset > nanoseconds(0) && reset != never) {
      // Whole seconds, rounded up, as the reference sends them.
      constexpr std::int64_t ns_per_s = 1'000'000'000;
      st->mutable_duration_until_reset()->set_seconds((reset.count() + ns_per_s - 1) / ns_per_s);
    }
    if (closest == nullptr || st->limit_remaining() < closest->limit_remaining()) {
      closest = st;
      closest_limit = a.limit;
    }
  }
  bool over = refusing > 0 || (quotas > 0 && quotas_over == quotas);
  if (over && options_.shadow_mode) {
    over = false;  // the statuses still say which descriptors are over
    global_shadow_.fetch_add(1, std::memory_order_relaxed);
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
  prometheus::family(out, "sluice_envoy_global_shadow_mode_total", "counter",
                     "ShouldRateLimit calls over a limit answered OK because [envoy] shadow_mode is on.");
  prometheus::sample(out, "sluice_envoy_global_shadow_mode_total", global_shadow_.load(std::memory_order_relaxed));
  counters_.append_metrics(out);
}

}  // namespace sluice::envoy
