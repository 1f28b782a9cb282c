// SPDX-License-Identifier: Apache-2.0
#include "sluice/error.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <system_error>

namespace sluice {
namespace {

TEST(Error, CategoryAndMessages) {
  std::error_code ec = errc::backend_timeout;
  EXPECT_STREQ(ec.category().name(), "sluice");
  EXPECT_EQ(ec.message(), "backend timeout");
  result<int> r(errc::invalid_argument, "x must be > 0");
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.error(), errc::invalid_argument);
}

// Backend failures are one condition: callers tell them from a request that can never be admitted.
TEST(ErrorCondition, BackendFailureCoversTheBackendCodesOnly) {
  for (errc e : {errc::backend_unavailable, errc::backend_timeout, errc::backend_protocol, errc::backend_overloaded}) {
    EXPECT_EQ(make_error_code(e), condition::backend_failure) << make_error_code(e).message();
    EXPECT_TRUE(error(e, "x") == condition::backend_failure);
  }
  for (errc e : {errc::invalid_argument, errc::cost_exceeds_burst, errc::capacity_exhausted, errc::config_invalid}) {
    EXPECT_NE(make_error_code(e), condition::backend_failure) << make_error_code(e).message();
  }
  EXPECT_NE(std::make_error_code(std::errc::timed_out), condition::backend_failure);
}

// Reading the value of an error (or the error of a value) is a checked precondition, not an
// exception: the process prints the held error's message and aborts, in every build.
TEST(ResultDeathTest, ValueOfAnErrorAbortsWithItsMessage) {
  const result<int> r(errc::invalid_argument, "burst must be >= 0, got -1");
  EXPECT_DEATH(static_cast<void>(r.value()),
               "result::value\\(\\) called on a result holding an error: burst must be >= 0, got -1");
  result<std::string> s(errc::config_invalid, "t.toml:1:1: bad");
  EXPECT_DEATH(static_cast<void>(*s), "t.toml:1:1: bad");
  EXPECT_DEATH(static_cast<void>(s->size()), "t.toml:1:1: bad");
  EXPECT_DEATH(static_cast<void>(std::move(s).value()), "t.toml:1:1: bad");
  result<std::unique_ptr<int>> p(errc::backend_unavailable, "no connection");
  EXPECT_DEATH(static_cast<void>(std::move(p).value()), "no connection");
}

TEST(ResultDeathTest, ErrorOfAValueAborts) {
  const result<int> r(42);
  EXPECT_DEATH(static_cast<void>(r.error()), "result::error\\(\\) called on a result holding a value");
}

TEST(Result, ValueAndErrorWhenThePreconditionHolds) {
  result<std::string> r(std::string("ok"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), "ok");
  EXPECT_EQ(r->size(), 2u);
  EXPECT_EQ(std::move(r).value(), "ok");
  const result<void> fine;
  EXPECT_TRUE(fine.ok());
  EXPECT_FALSE(fine.error().code);  // result<void>: an empty error while ok
}

}  // namespace
}  // namespace sluice
