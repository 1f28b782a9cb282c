// SPDX-License-Identifier: Apache-2.0
// envoy_source in a build without the Envoy component (SLUICE_WITH_ENVOY=OFF).
#include "server/envoy_source.hpp"

namespace sluice::server {

result<std::unique_ptr<envoy_source>> envoy_source::start(const envoy_settings&, const std::string&,
                                                          const envoy::grpc_limits&, backend&) {
  return error(errc::config_invalid,
               "[server] grpc_listen: this sluiced was built without Envoy support (SLUICE_WITH_ENVOY=OFF)");
}

}  // namespace sluice::server
