// SPDX-License-Identifier: Apache-2.0
#include "server/envoy_source.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <thread>
#include <tuple>
#include <vector>

#include "envoy/domain_config.hpp"
#include "envoy/rls_rules.hpp"
#include "envoy/rls_server.hpp"
#include "envoy/rls_service.hpp"
#include "server/log_fields.hpp"
#include "sluice/prometheus.hpp"

namespace sluice::server {
namespace {

namespace fs = std::filesystem;

// What tells a change of the directory: each YAML file's name, size and modification time.
using dir_signature = std::vector<std::tuple<std::string, std::uintmax_t, fs::file_time_type>>;

dir_signature signature_of(const std::string& dir) {
  dir_signature sig;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const auto ext = it->path().extension();
    if (ext != ".yaml" && ext != ".yml") continue;
    std::error_code e1, e2;
    sig.emplace_back(it->path().filename().string(), it->file_size(e1), it->last_write_time(e2));
  }
  std::sort(sig.begin(), sig.end());
  return sig;
}

class envoy_source_impl final : public envoy_source {
 public:
  envoy_source_impl(const envoy_settings& e, backend& b)
      : dir_(e.config_dir), merge_(e.merge_domains), backend_(b), service_(b, e.options) {}

  result<void> load() {
    applied_ = signature_of(dir_);
    pending_ = applied_;
    auto domains = envoy::load_domains(dir_, merge_);
    if (!domains) return domains.error();
    for (const auto& d : *domains) {
      for (const std::string& what : d.ignored) spdlog::warn("event=envoy_config_ignored what={}", log_value(what));
    }
    auto rules = envoy::rls_rules::build(std::move(*domains), backend_, service_.rules().get(), service_.counters());
    if (!rules) return rules.error();
    const auto& r = **rules;
    spdlog::info("event=envoy_config result=success dir={} domains={} limits={} changed_limits={}", log_value(dir_),
                 r.domain_count(), r.limit_count(), r.limit_count() - r.rules().kept());
    service_.set_rules(std::move(*rules));
    return {};
  }

  result<void> listen(const std::string& address, const envoy::grpc_limits& limits) {
    auto s = envoy::rls_server::start(address, service_, limits);
    if (!s) return s.error();
    server_ = std::move(*s);
    spdlog::info("event=grpc_listening address={} port={}", log_value(address), server_->port());
    return {};
  }

  void poll() override {
    if (dir_.empty()) return;
    dir_signature now = signature_of(dir_);
    if (now == applied_) {
      pending_ = now;
      return;
    }
    if (now != pending_) {  // still changing: read it once it has settled
      pending_ = std::move(now);
      return;
    }
    reload("file_change");
  }

  void reload(std::string_view trigger) override {
    if (dir_.empty()) return;  // no [envoy]: nothing to read
    if (auto r = load(); !r) {
      reload_failures_.fetch_add(1, std::memory_order_relaxed);
      spdlog::error("event=envoy_config result=failure trigger={} error={}", trigger, log_value(r.error().message));
    }
  }

  void append_metrics(std::string& out) override {
    service_.append_metrics(out);
    if (server_) server_->append_metrics(out);
    auto rules = service_.rules();
    prometheus::family(out, "sluice_envoy_domains", "gauge", "Domains of the Envoy configuration in force.");
    prometheus::sample(out, "sluice_envoy_domains", static_cast<std::uint64_t>(rules ? rules->domain_count() : 0));
    prometheus::family(out, "sluice_envoy_limits", "gauge",
                       "Limits (not unlimited) of the Envoy configuration in force.");
    prometheus::sample(out, "sluice_envoy_limits", static_cast<std::uint64_t>(rules ? rules->limit_count() : 0));
    prometheus::family(out, "sluice_envoy_config_errors_total", "counter",
                       "Reloads of the Envoy directory refused (the running limits were kept).");
    prometheus::sample(out, "sluice_envoy_config_errors_total", reload_failures_.load(std::memory_order_relaxed));
  }

  ~envoy_source_impl() override { shutdown(); }

  void begin_shutdown(std::chrono::milliseconds grace) override {
    if (!server_ || stopper_.joinable()) return;
    stopper_ = std::thread([this, grace] { server_->shutdown(grace); });
  }

  void shutdown() override {
    begin_shutdown(std::chrono::milliseconds(0));
    if (stopper_.joinable()) stopper_.join();
  }

 private:
  std::string dir_;
  bool merge_ = false;
  backend& backend_;
  envoy::rls_service service_;
  std::unique_ptr<envoy::rls_server> server_;
  dir_signature applied_, pending_;
  std::atomic<std::uint64_t> reload_failures_{0};
  std::thread stopper_;  // runs the server's shutdown (begin_shutdown)
};

}  // namespace

result<std::unique_ptr<envoy_source>> envoy_source::start(const envoy_settings& settings,
                                                          const std::string& grpc_listen,
                                                          const envoy::grpc_limits& limits, backend& b) {
  auto s = std::make_unique<envoy_source_impl>(settings, b);
  if (settings.enabled) {
    if (auto r = s->load(); !r) return r.error();
  }
  if (auto r = s->listen(grpc_listen, limits); !r) return r.error();
  return std::unique_ptr<envoy_source>(std::move(s));
}

}  // namespace sluice::server
