// SPDX-License-Identifier: Apache-2.0
#include "sluice/etcd/options.hpp"

#include <gtest/gtest.h>

#include <functional>

namespace sluice::etcd {
namespace {

using namespace std::chrono_literals;

TEST(EtcdOptionsTest, DefaultsAreValid) { EXPECT_TRUE(validate({}).ok()); }

TEST(EtcdOptionsTest, EachInvalidOptionIsNamed) {
  const std::vector<std::pair<std::function<void(etcd_options&)>, std::string>> cases = {
      {[](etcd_options& o) { o.endpoints.clear(); }, "etcd: endpoints is empty: name at least one host:port"},
      {[](etcd_options& o) { o.endpoints = {"localhost"}; }, "etcd: endpoint address \"localhost\" has no port"},
      {[](etcd_options& o) {
         o.endpoints = {"a:1", "::1:2379"};
       },
       "needs brackets"},
      {[](etcd_options& o) { o.endpoints = {"a:0"}; }, "etcd: endpoint \"a:0\" has port 0"},
      {[](etcd_options& o) { o.password = "pw"; }, "etcd: password is set but username is empty"},
      {[](etcd_options& o) { o.cert_file = "c.pem"; }, "etcd: cert_file and key_file must be set together"},
      {[](etcd_options& o) { o.key_file = "k.pem"; }, "etcd: cert_file and key_file must be set together"},
      {[](etcd_options& o) { o.dial_timeout = 0ms; }, "etcd: dial_timeout must be > 0 ms"},
      {[](etcd_options& o) { o.request_timeout = -1ms; }, "etcd: request_timeout must be > 0 ms"},
      {[](etcd_options& o) { o.backoff_base = 0ms; }, "etcd: backoff_base must be > 0 ms"},
      {[](etcd_options& o) { o.backoff_cap = 100ms; }, "etcd: backoff_cap must be >= backoff_base"},
      {[](etcd_options& o) { o.backoff_cap = 11min; }, "etcd: backoff_cap must be at most 10 min"},
      {[](etcd_options& o) { o.max_keys = 0; }, "etcd: max_keys must be >= 1"},
      {[](etcd_options& o) { o.max_value_bytes = 0; }, "etcd: max_value_bytes must be >= 1"},
      {[](etcd_options& o) { o.max_key_bytes = 0; }, "etcd: max_key_bytes must be >= 1"},
  };
  for (const auto& [change, message] : cases) {
    etcd_options o;
    change(o);
    auto r = validate(o);
    ASSERT_FALSE(r.ok()) << message;
    EXPECT_EQ(r.error(), errc::invalid_argument);
    EXPECT_NE(r.error().message.find(message), std::string::npos) << r.error().message;
  }
}

TEST(EtcdOptionsTest, IPv6AndNamesAreAccepted) {
  EXPECT_TRUE(validate({.endpoints = {"[::1]:2379", "etcd-1.example:2379", "10.0.0.5:2379"}}).ok());
  EXPECT_TRUE(validate({.prefix = ""}).ok());  // the whole keyspace
}

}  // namespace
}  // namespace sluice::etcd
