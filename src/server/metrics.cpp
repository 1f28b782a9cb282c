// SPDX-License-Identifier: Apache-2.0
// Prometheus text exposition for sluiced, written by hand: a handful of counters and one histogram.
#include "server/metrics.hpp"

#include "sluice/prometheus.hpp"

#include <cstdio>

namespace sluice::server {

namespace {

using prometheus::escape_label;

std::string format_double(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

void header(std::string& out, const char* name, const char* type, const char* help) {
  prometheus::family(out, name, type, help);
}

void sample(std::string& out, const std::string& name_and_labels, std::uint64_t v) {
  prometheus::sample(out, name_and_labels, v);
}

}  // namespace

metrics::metrics(const metrics_options& options) : options_(options) {}

metrics::shard& metrics::my_shard() {
  static std::atomic<std::size_t> next_thread{0};
  thread_local const std::size_t index = next_thread.fetch_add(1, std::memory_order_relaxed);
  return shards_[index % shard_count];
}

metrics::rule_stats& metrics::stats_for(shard& s, std::string_view rule) {
  auto it = s.rules.find(rule);
  if (it == s.rules.end()) it = s.rules.emplace(std::string(rule), rule_stats{}).first;
  return it->second;
}

std::string metrics::tenant_label(std::string_view tenant) {
  std::lock_guard lock(tenants_mu_);
  if (tenants_.find(tenant) != tenants_.end()) return std::string(tenant);
  if (tenants_.size() < options_.max_tenant_labels) {
    tenants_.emplace(tenant);
    return std::string(tenant);
  }
  return "other";
}

namespace {

void observe(std::array<std::uint64_t, metrics::latency_buckets.size()>& buckets, std::uint64_t& count, double& sum,
             nanoseconds latency) {
  double s = std::chrono::duration<double>(latency).count();
  for (std::size_t i = 0; i < metrics::latency_buckets.size(); ++i) {
    if (s <= metrics::latency_buckets[i]) ++buckets[i];
  }
  ++count;
  sum += s;
}

}  // namespace

void metrics::record_decision(std::string_view rule, std::string_view tenant, const decision& d, nanoseconds latency,
                              bool shadow) {
  std::string tenant_value;
  if (!d.allowed && d.dual_layer && !shadow) tenant_value = tenant_label(tenant);
  shard& s = my_shard();
  std::lock_guard lock(s.mu);
  rule_stats& r = stats_for(s, rule);
  if (d.allowed) {
    ++r.allowed;
  } else if (shadow) {
    ++r.shadow_rejected;
  } else {
    ++r.rejected;
    layer l = d.dual_layer ? d.rejected_by : layer::none;
    ++r.rejections[{l, std::move(tenant_value)}];
  }
  if (d.source != decision_source::limiter) ++r.sources[d.source];
  observe(r.latency.buckets, r.latency.count, r.latency.sum, latency);
}

void metrics::record_look(std::string_view rule, nanoseconds latency) {
  shard& s = my_shard();
  std::lock_guard lock(s.mu);
  rule_stats& r = stats_for(s, rule);
  ++r.looked;
  observe(r.latency.buckets, r.latency.count, r.latency.sum, latency);
}

void metrics::record_reset(std::string_view rule, bool done) {
  shard& s = my_shard();
  std::lock_guard lock(s.mu);
  ++(done ? stats_for(s, rule).resets : stats_for(s, rule).resets_failed);
}

void metrics::record_backend_error(std::string_view rule, const error& e, nanoseconds latency) {
  shard& s = my_shard();
  std::lock_guard lock(s.mu);
  rule_stats& r = stats_for(s, rule);
  ++r.errors;
  ++r.backend_errors[e.code.message()];
  observe(r.latency.buckets, r.latency.count, r.latency.sum, latency);
}

void metrics::record_reload(bool succeeded) {
  (succeeded ? reloads_ok_ : reloads_failed_).fetch_add(1, std::memory_order_relaxed);
}

void metrics::record_response(int status) {
  if (status >= 0 && status < static_cast<int>(responses_.size())) {
    responses_[static_cast<std::size_t>(status)].fetch_add(1, std::memory_order_relaxed);
  }
}

std::string metrics::render(const metrics_gauges& gauges) const {
  // Sum the shards into one view.
  std::map<std::string, rule_stats, std::less<>> rules_;
  for (const std::string& rule : gauges.rules) rules_[rule];  // in force: shown at 0 until checked
  for (auto& sh : shards_) {
    std::lock_guard lock(sh.mu);
    for (const auto& [name, r] : sh.rules) {
      rule_stats& m = rules_[name];
      m.allowed += r.allowed;
      m.rejected += r.rejected;
      m.looked += r.looked;
      m.shadow_rejected += r.shadow_rejected;
      m.resets += r.resets;
      m.resets_failed += r.resets_failed;
      m.errors += r.errors;
      for (std::size_t i = 0; i < latency_buckets.size(); ++i) m.latency.buckets[i] += r.latency.buckets[i];
      m.latency.count += r.latency.count;
      m.latency.sum += r.latency.sum;
      for (const auto& [k, v] : r.rejections) m.rejections[k] += v;
      for (const auto& [k, v] : r.sources) m.sources[k] += v;
      for (const auto& [k, v] : r.backend_errors) m.backend_errors[k] += v;
    }
  }
  std::string out;
  out.reserve(4096);
  header(out, "sluice_checks_total", "counter", "Checks by rule and result (allowed, rejected, shadow_rejected: a shadow rule's refusal, admitted, looked: a cost of 0, error).");
  for (const auto& [rule, r] : rules_) {
    std::string prefix = "sluice_checks_total{rule=\"" + escape_label(rule) + "\",result=\"";
    sample(out, prefix + "allowed\"}", r.allowed);
    sample(out, prefix + "rejected\"}", r.rejected);
    sample(out, prefix + "shadow_rejected\"}", r.shadow_rejected);
    sample(out, prefix + "looked\"}", r.looked);
    sample(out, prefix + "error\"}", r.errors);
  }
  header(out, "sluice_resets_total", "counter", "Keys reset by POST /v1/reset, by rule and result (done, error).");
  for (const auto& [rule, r] : rules_) {
    std::string prefix = "sluice_resets_total{rule=\"" + escape_label(rule) + "\",result=\"";
    sample(out, prefix + "done\"}", r.resets);
    sample(out, prefix + "error\"}", r.resets_failed);
  }
  header(out, "sluice_rejections_total", "counter",
         "Refused checks by rule, refusing layer (single, tenant, user) and tenant (capped; later tenants are "
         "\"other\").");
  for (const auto& [rule, r] : rules_) {
    for (const auto& [k, v] : r.rejections) {
      std::string layer_name = k.first == layer::none ? "single" : std::string(to_string(k.first));
      sample(out,
             "sluice_rejections_total{rule=\"" + escape_label(rule) + "\",layer=\"" + layer_name + "\",tenant=\"" +
                 escape_label(k.second) + "\"}",
             v);
    }
  }
  header(out, "sluice_backend_errors_total", "counter", "Checks that failed with a backend error, by rule and error.");
  for (const auto& [rule, r] : rules_) {
    for (const auto& [code, v] : r.backend_errors) {
      sample(out,
             "sluice_backend_errors_total{rule=\"" + escape_label(rule) + "\",error=\"" + escape_label(code) + "\"}",
             v);
    }
  }
  header(out, "sluice_failure_policy_decisions_total", "counter",
         "Decisions not made by the limiter, by rule and source (fail_open, fail_closed, local_fallback, disabled).");
  std::uint64_t fail_open = 0;
  for (const auto& [rule, r] : rules_) {
    for (const auto& [source, v] : r.sources) {
      if (source == decision_source::fail_open) fail_open += v;
      sample(out,
             "sluice_failure_policy_decisions_total{rule=\"" + escape_label(rule) + "\",source=\"" +
                 std::string(to_string(source)) + "\"}",
             v);
    }
  }
  header(out, "sluice_fail_open_total", "counter", "Checks admitted because the backend failed (on_error = allow).");
  sample(out, "sluice_fail_open_total", fail_open);
  header(out, "sluice_check_duration_seconds", "histogram", "Time from request parsed to decision, by rule.");
  for (const auto& [rule, r] : rules_) {
    std::string l = escape_label(rule);
    const histogram& h = r.latency;
    for (std::size_t i = 0; i < latency_buckets.size(); ++i) {
      sample(
          out,
          "sluice_check_duration_seconds_bucket{rule=\"" + l + "\",le=\"" + format_double(latency_buckets[i]) + "\"}",
          h.buckets[i]);
    }
    sample(out, "sluice_check_duration_seconds_bucket{rule=\"" + l + "\",le=\"+Inf\"}", h.count);
    out += "sluice_check_duration_seconds_sum{rule=\"" + l + "\"} " + format_double(h.sum) + '\n';
    sample(out, "sluice_check_duration_seconds_count{rule=\"" + l + "\"}", h.count);
  }
  header(out, "sluice_config_reloads_total", "counter", "Config reloads by result (success, failure).");
  sample(out, "sluice_config_reloads_total{result=\"success\"}", reloads_ok_.load());
  sample(out, "sluice_config_reloads_total{result=\"failure\"}", reloads_failed_.load());
  header(out, "sluice_http_responses_total", "counter", "HTTP responses by status code.");
  for (std::size_t status = 0; status < responses_.size(); ++status) {
    std::uint64_t v = responses_[status].load(std::memory_order_relaxed);
    if (v) sample(out, "sluice_http_responses_total{code=\"" + std::to_string(status) + "\"}", v);
  }
  header(out, "sluice_backend_ready", "gauge", "1 when the backend answers, else 0.");
  out += std::string("sluice_backend_ready ") + (gauges.backend_ready ? "1" : "0") + '\n';
  return out;
}

}  // namespace sluice::server
