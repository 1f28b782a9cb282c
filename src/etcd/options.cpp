// SPDX-License-Identifier: Apache-2.0
#include "sluice/etcd/options.hpp"

#include <string>

#include "sluice/host_port.hpp"

namespace sluice::etcd {
namespace {

error invalid(std::string what) { return {errc::invalid_argument, "etcd: " + std::move(what)}; }

}  // namespace

result<void> validate(const etcd_options& o) {
  using std::chrono::milliseconds;
  if (o.endpoints.empty()) return invalid("endpoints is empty: name at least one host:port");
  for (const auto& e : o.endpoints) {
    auto hp = parse_host_port(e);
    if (!hp) return invalid("endpoint " + hp.error().message);
    if (hp->port == 0) return invalid("endpoint \"" + e + "\" has port 0");
  }
  if (!o.password.empty() && o.username.empty()) return invalid("password is set but username is empty");
  if (o.cert_file.empty() != o.key_file.empty()) return invalid("cert_file and key_file must be set together");
  if (o.dial_timeout <= milliseconds::zero()) return invalid("dial_timeout must be > 0 ms");
  if (o.request_timeout <= milliseconds::zero()) return invalid("request_timeout must be > 0 ms");
  if (o.backoff_base <= milliseconds::zero()) return invalid("backoff_base must be > 0 ms");
  if (o.backoff_cap < o.backoff_base) return invalid("backoff_cap must be >= backoff_base");
  if (o.backoff_cap > std::chrono::minutes(10)) return invalid("backoff_cap must be at most 10 min");
  if (o.max_keys == 0) return invalid("max_keys must be >= 1");
  if (o.max_value_bytes == 0) return invalid("max_value_bytes must be >= 1");
  if (o.max_key_bytes == 0) return invalid("max_key_bytes must be >= 1");
  return {};
}

}  // namespace sluice::etcd
