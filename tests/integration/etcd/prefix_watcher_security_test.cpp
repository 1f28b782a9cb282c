// The prefix watcher against an etcd that asks who it is: a user and password (a token on every
// call, a new one after etcd restarts and forgets it), and TLS with client certificates.
#include "sluice/etcd/prefix_watcher.hpp"

#include <gtest/gtest.h>

#include <chrono>

#include "integration/etcd/etcd_server.hpp"
#include "integration/etcd/watch_recorder.hpp"

namespace sluice::etcd {
namespace {

using namespace std::chrono_literals;
using sluice::testing::etcd_server;
using sluice::testing::watch_recorder;

etcd_options options_for(const etcd_server& etcd) {
  return {.endpoints = {etcd.endpoint()}, .prefix = "/sluice/", .dial_timeout = 2s, .backoff_base = 50ms, .backoff_cap = 500ms};
}

TEST(PrefixWatcherSecurityTest, AuthenticatesAndAgainAfterARestart) {
  etcd_server etcd;
  etcd.enable_auth("root-secret");
  etcd.add_reader("sluice", "reader-secret", "/sluice/");
  const auto a = etcd.put("/sluice/a", "1");
  auto o = options_for(etcd);
  o.username = "sluice";
  o.password = "reader-secret";
  watch_recorder rec;
  auto w = prefix_watcher::create(o, rec.callback());
  ASSERT_TRUE(w.ok());
  auto& watcher = **w;
  ASSERT_TRUE(rec.wait_until([&] { return watcher.status().connected; })) << watcher.status().last_error;
  EXPECT_EQ(watcher.entries().at("a").mod_revision, a);
  const auto b = etcd.put("/sluice/b", "1");
  ASSERT_TRUE(rec.wait_until([&] { return watcher.status().revision == b; }));

  // etcd's simple tokens live in its memory: after a restart the old token is unknown.
  etcd.kill();
  ASSERT_TRUE(rec.wait_until([&] { return !watcher.status().connected; }));
  etcd.restart();
  ASSERT_TRUE(rec.wait_until([&] { return watcher.status().connected; })) << watcher.status().last_error;
  const auto c = etcd.put("/sluice/c", "1");
  ASSERT_TRUE(rec.wait_until([&] { return watcher.status().revision == c; })) << watcher.status().last_error;
  EXPECT_EQ(watcher.entries().size(), 3u);
  EXPECT_EQ(watcher.status().full_reads, 1u);
}

TEST(PrefixWatcherSecurityTest, WrongPasswordIsReported) {
  etcd_server etcd;
  etcd.enable_auth("root-secret");
  auto o = options_for(etcd);
  o.username = "root";
  o.password = "not it";
  watch_recorder rec;
  auto w = prefix_watcher::create(o, rec.callback());
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(rec.wait_until([&] { return !(*w)->status().last_error.empty(); }));
  const auto s = (*w)->status();
  EXPECT_FALSE(s.connected);
  EXPECT_NE(s.last_error.find("authenticate"), std::string::npos) << s.last_error;
  EXPECT_NE(s.last_error.find("authentication failed"), std::string::npos) << s.last_error;
}

TEST(PrefixWatcherSecurityTest, WithoutAuthenticationEtcdRefusesTheRead) {
  etcd_server etcd;
  etcd.enable_auth("root-secret");
  watch_recorder rec;
  auto w = prefix_watcher::create(options_for(etcd), rec.callback());
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(rec.wait_until([&] { return !(*w)->status().last_error.empty(); }));
  EXPECT_FALSE((*w)->status().connected);
  EXPECT_NE((*w)->status().last_error.find("range"), std::string::npos) << (*w)->status().last_error;
}

TEST(PrefixWatcherSecurityTest, TlsWithClientCertificates) {
  etcd_server etcd(etcd_server::transport::tls);
  const auto a = etcd.put("/sluice/a", "1");
  auto o = options_for(etcd);
  o.ca_file = etcd.ca_file();
  o.cert_file = etcd.client_cert_file();
  o.key_file = etcd.client_key_file();
  watch_recorder rec;
  auto w = prefix_watcher::create(o, rec.callback());
  ASSERT_TRUE(w.ok()) << w.error().message;
  ASSERT_TRUE(rec.wait_until([&] { return (*w)->status().connected; })) << (*w)->status().last_error;
  EXPECT_EQ((*w)->entries().at("a").mod_revision, a);
  const auto b = etcd.put("/sluice/b", "2");
  ASSERT_TRUE(rec.wait_until([&] { return (*w)->status().revision == b; }));
  EXPECT_EQ((*w)->entries().at("b").value, "2");
}

TEST(PrefixWatcherSecurityTest, TlsWithoutAClientCertificateIsRefused) {
  etcd_server etcd(etcd_server::transport::tls);
  auto o = options_for(etcd);
  o.ca_file = etcd.ca_file();
  watch_recorder rec;
  auto w = prefix_watcher::create(o, rec.callback());
  ASSERT_TRUE(w.ok()) << w.error().message;
  ASSERT_TRUE(rec.wait_until([&] { return !(*w)->status().last_error.empty(); }));
  EXPECT_FALSE((*w)->status().connected);
}

TEST(PrefixWatcherSecurityTest, PlaintextToATlsServerIsRefused) {
  etcd_server etcd(etcd_server::transport::tls);
  watch_recorder rec;
  auto w = prefix_watcher::create(options_for(etcd), rec.callback());
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(rec.wait_until([&] { return !(*w)->status().last_error.empty(); }));
  EXPECT_FALSE((*w)->status().connected);
}

TEST(PrefixWatcherSecurityTest, UnreadableTlsFileIsAConfigError) {
  auto w = prefix_watcher::create({.ca_file = "/nonexistent/ca.pem"}, nullptr);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.error(), errc::config_invalid);
  EXPECT_NE(w.error().message.find("ca_file \"/nonexistent/ca.pem\""), std::string::npos) << w.error().message;
}

}  // namespace
}  // namespace sluice::etcd
