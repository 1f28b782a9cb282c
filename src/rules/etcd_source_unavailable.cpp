// SPDX-License-Identifier: Apache-2.0
// etcd_source in a build without the etcd component (SLUICE_WITH_ETCD=OFF).
#include "rules/etcd_source.hpp"

namespace sluice::server {

result<std::unique_ptr<etcd_source>> etcd_source::start(const etcd_settings&, std::function<void()>) {
  return error(errc::config_invalid, "[etcd]: this sluiced was built without etcd support (SLUICE_WITH_ETCD=OFF)");
}

}  // namespace sluice::server
