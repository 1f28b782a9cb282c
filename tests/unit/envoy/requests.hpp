// SPDX-License-Identifier: Apache-2.0
// Envoy RateLimitRequests for tests: descriptors as lists of (key, value) entries.
//
//   auto r = sluice::testing::rls_request({{{"remote_address", "10.0.0.1"}, {"path", "/x"}}}, 2);
#pragma once

#include <cstdint>
#include <initializer_list>
#include <utility>

#include "envoy/service/ratelimit/v3/rls.pb.h"

namespace sluice::testing {

using rls_entries = std::initializer_list<std::pair<const char*, const char*>>;

inline ::envoy::service::ratelimit::v3::RateLimitRequest rls_request(std::initializer_list<rls_entries> descriptors,
                                                                     std::uint32_t hits = 0,
                                                                     const char* domain = "edge") {
  ::envoy::service::ratelimit::v3::RateLimitRequest r;
  r.set_domain(domain);
  r.set_hits_addend(hits);
  for (const rls_entries& d : descriptors) {
    auto* desc = r.add_descriptors();
    for (const auto& [k, v] : d) {
      auto* e = desc->add_entries();
      e->set_key(k);
      e->set_value(v);
    }
  }
  return r;
}

}  // namespace sluice::testing
