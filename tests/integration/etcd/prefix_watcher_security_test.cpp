// SPDX-License-Identifier: Apache-2.0
// The prefix watcher against an etcd that asks who it is: a user and password (a token on every
// call, a new one after etcd restarts and forgets it), and TLS with client certificates.
#include "sluice/etcd/prefix_watcher.hpp"

#include <gtest/gtest.h>

#include "integration/etcd/etcd_server.hpp"
#include "integration/etcd/watch_recorder.hpp"

namespace sluice::etcd {
namespace {

using sluice::testing::etcd_server;
using sluice::testing::recorded_watcher;
using sluice::testing::test_options;

TEST(PrefixWatcherSecurityTest, AuthenticatesAndAgainAfterARestart) {
  etcd_server etcd;
  etcd.enable_auth("root-secret");
  etcd.add_reader("sluice", "reader-secret", "/sluice/");
  const auto a = etcd.put("/sluice/a", "1");
  auto o = test_options(etcd.endpoint());
  o.username = "sluice";
  o.password = "reader-secret";
  recorded_watcher x(o);
  ASSERT_TRUE(x.connected()) << x.w->status().last_error;
  EXPECT_EQ(x.w->entries().at("a").mod_revision, a);
  ASSERT_TRUE(x.at(etcd.put("/sluice/b", "1")));

  // etcd's simple tokens live in its memory: after a restart the old token is unknown.
  etcd.kill();
  ASSERT_TRUE(x.disconnected());
  etcd.restart();
  ASSERT_TRUE(x.at(etcd.put("/sluice/c", "1"))) << x.w->status().last_error;
  EXPECT_EQ(x.w->entries().size(), 3u);
  EXPECT_EQ(x.w->status().full_reads, 1u);
}

TEST(PrefixWatcherSecurityTest, WrongPasswordIsReported) {
  etcd_server etcd;
  etcd.enable_auth("root-secret");
  auto o = test_options(etcd.endpoint());
  o.username = "root";
  o.password = "not it";
  recorded_watcher x(o);
  ASSERT_TRUE(x.failed());
  const auto s = x.w->status();
  EXPECT_FALSE(s.connected);
  EXPECT_NE(s.last_error.find("authenticate on " + etcd.endpoint()), std::string::npos) << s.last_error;
  EXPECT_NE(s.last_error.find("authentication failed"), std::string::npos) << s.last_error;
}

TEST(PrefixWatcherSecurityTest, WithoutAUserEtcdRefusesTheRead) {
  etcd_server etcd;
  etcd.enable_auth("root-secret");
  recorded_watcher x(test_options(etcd.endpoint()));
  ASSERT_TRUE(x.failed());
  const auto s = x.w->status();
  EXPECT_FALSE(s.connected);
  EXPECT_NE(s.last_error.find("range on " + etcd.endpoint()), std::string::npos) << s.last_error;
}

TEST(PrefixWatcherSecurityTest, TlsWithClientCertificates) {
  etcd_server etcd(etcd_server::transport::tls);
  const auto a = etcd.put("/sluice/a", "1");
  auto o = test_options(etcd.endpoint());
  o.ca_file = etcd.ca_file();
  o.cert_file = etcd.client_cert_file();
  o.key_file = etcd.client_key_file();
  recorded_watcher x(o);
  ASSERT_TRUE(x.connected()) << x.w->status().last_error;
  EXPECT_EQ(x.w->entries().at("a").mod_revision, a);
  ASSERT_TRUE(x.at(etcd.put("/sluice/b", "2")));
  EXPECT_EQ(x.w->entries().at("b").value, "2");
}

TEST(PrefixWatcherSecurityTest, TlsWithoutAClientCertificateIsRefused) {
  etcd_server etcd(etcd_server::transport::tls);
  auto o = test_options(etcd.endpoint());
  o.ca_file = etcd.ca_file();
  recorded_watcher x(o);
  ASSERT_TRUE(x.failed());
  EXPECT_FALSE(x.w->status().connected);
}

TEST(PrefixWatcherSecurityTest, PlaintextToATlsServerIsRefused) {
  etcd_server etcd(etcd_server::transport::tls);
  recorded_watcher x(test_options(etcd.endpoint()));
  ASSERT_TRUE(x.failed());
  EXPECT_FALSE(x.w->status().connected);
}

TEST(PrefixWatcherSecurityTest, UnreadableTlsFileIsAConfigError) {
  auto w = prefix_watcher::create({.ca_file = "/nonexistent/ca.pem"}, nullptr);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.error(), errc::invalid_argument);
  EXPECT_NE(w.error().message.find("ca_file \"/nonexistent/ca.pem\""), std::string::npos) << w.error().message;
}

}  // namespace
}  // namespace sluice::etcd
