// SPDX-License-Identifier: Apache-2.0
// tests/support/prepared.hpp — a rule prepared for a test's checks: a backend checks only rules it
// prepared (backend::prepare), so a test that defines a rule inline prepares it first.
//
//   EXPECT_TRUE(b->check({.rule = prepared(*b, r).get(), .key = "k"}).value().allowed);
//
// Prepared for one expression like this, a rule keeps no state of its own in the process: right for
// Redis, whose state is on the server. A test of state kept in the process (the memory backend, a
// local fallback, leases) holds its prepared rule for as long as the state must last.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "sluice/backend.hpp"

namespace sluice::testing {

/// `r` prepared on `b`; null (and the test failed) when `b` refuses it.
inline prepared_rule_ptr prepared(backend& b, const rule& r) {
  auto p = b.prepare(r);
  if (!p) {
    ADD_FAILURE() << "prepare('" << r.name << "'): " << p.error().message;
    return nullptr;
  }
  return std::move(*p);
}

}  // namespace sluice::testing

namespace sluice::testing {

/// The same rules on two backends, index-aligned, for tests comparing their decisions.
struct twin_rules {
  twin_rules(backend& a, backend& b, const std::vector<rule>& rules) {
    for (const rule& r : rules) {
      on_a.push_back(prepared(a, r));
      on_b.push_back(prepared(b, r));
    }
  }
  /// `req`, a check of one of on_a's rules, as a check of the same rule on b.
  check_request on_b_of(check_request req) const {
    for (std::size_t i = 0; i < on_a.size(); ++i) {
      if (on_a[i].get() == req.rule) req.rule = on_b[i].get();
    }
    return req;
  }
  std::vector<prepared_rule_ptr> on_a;
  std::vector<prepared_rule_ptr> on_b;
};

}  // namespace sluice::testing
