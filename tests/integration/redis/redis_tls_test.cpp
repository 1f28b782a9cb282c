// SPDX-License-Identifier: Apache-2.0
// The Redis backend over TLS and with a minimal ACL user, against a real redis-server with a
// tls-port and certificates this test makes with the openssl CLI: checks decided over TLS and
// mutual TLS, and every TLS failure (unknown CA, expired certificate, wrong name, a plaintext
// server, a TLS server on a plaintext setting) one log line naming the address and the reason, the
// backend not ready, checks by on_error.
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "integration/free_port.hpp"
#include "integration/redis/byte_proxy.hpp"
#include "integration/redis/redis_cluster.hpp"
#include "integration/redis/redis_server.hpp"
#include "redis/slot.hpp"
#include "sluice/redis_backend.hpp"
#include "support/log_capture.hpp"
#include "support/prepared.hpp"

namespace sluice {
namespace {

using namespace std::chrono_literals;
using sluice::testing::log_capture;
using sluice::testing::prepared;
using sluice::testing::redis_server;
namespace fs = std::filesystem;

// A CA, a second CA nobody trusts, and what they sign: the server's certificate (for 127.0.0.1 and
// redis.test), an expired one, and a client's.
class certificates {
 public:
  certificates() {
    char tmpl[] = "/tmp/sluice-tls-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
    write("san.cnf", "subjectAltName = IP:127.0.0.1, DNS:redis.test\n");
    write("ca.cnf", "[ca]\ndefault_ca = own\n[own]\ndir = " + dir_.string() +
                        "\ndatabase = $dir/index.txt\nnew_certs_dir = $dir\nserial = $dir/serial\n"
                        "default_md = sha256\npolicy = any\ncopy_extensions = none\n[any]\ncommonName = supplied\n");
    write("index.txt", "");
    write("serial", "01\n");
    make_ca("ca");
    make_ca("other_ca");
    make_csr("server", "redis.test");
    run("openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile san.cnf "
        "-out server.crt");
    run("openssl ca -batch -config ca.cnf -cert ca.crt -keyfile ca.key -startdate 20200101000000Z "
        "-enddate 20200201000000Z -extfile san.cnf -in server.csr -out expired.crt");
    make_csr("client", "sluice");
    run("openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -out client.crt");
  }
  ~certificates() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

 private:
  void write(const std::string& name, const std::string& text) { std::ofstream(dir_ / name) << text; }
  void run(const std::string& command) {
    const std::string line = "cd " + dir_.string() + " && " + command + " >/dev/null 2>&1";
    if (std::system(line.c_str()) != 0) throw std::runtime_error("failed: " + command);
  }
  void make_ca(const std::string& name) {
    run("openssl req -x509 -newkey rsa:2048 -nodes -keyout " + name + ".key -out " + name +
        ".crt -days 2 -subj /CN=" + name);
  }
  void make_csr(const std::string& name, const std::string& cn) {
    run("openssl req -newkey rsa:2048 -nodes -keyout " + name + ".key -out " + name + ".csr -subj /CN=" + cn);
  }
  fs::path dir_;
};

const rule three_per_minute{.name = "tls", .limit = fixed_window_policy(3, 60s)};

class RedisTlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { certs_ = new certificates(); }
  static void TearDownTestSuite() {
    delete certs_;
    certs_ = nullptr;
  }

  // A redis-server with a plaintext port (the fixture's own) and a TLS port; clients must show a
  // certificate when `mutual`.
  static std::unique_ptr<redis_server> start(int tls_port, bool mutual, const std::string& cert = "server.crt") {
    return std::make_unique<redis_server>(
        std::vector<std::string>{"--tls-port", std::to_string(tls_port), "--tls-cert-file", certs_->path(cert),
                                 "--tls-key-file", certs_->path("server.key"), "--tls-ca-cert-file",
                                 certs_->path("ca.crt"), "--tls-auth-clients", mutual ? "yes" : "no"});
  }

  static redis_options tls_options(int port) {
    return {.addresses = {"127.0.0.1:" + std::to_string(port)},
            .tls = true,
            .tls_ca_file = certs_->path("ca.crt"),
            .connect_timeout = 2000ms,
            .command_timeout = 2000ms,
            .on_error = failure_policy::deny,
            .breaker_probe_interval = 50ms,
            .error_log_interval = 10ms};
  }

  // Four checks of three_per_minute on a fresh key: three admitted by Redis, the fourth refused.
  static void expect_decided_by_redis(redis_backend& b, const std::string& key) {
    auto r = prepared(b, three_per_minute);
    for (int i = 0; i < 4; ++i) {
      auto d = b.check({.rule = r.get(), .key = key});
      ASSERT_TRUE(d) << d.error().message;
      EXPECT_EQ(d->source, decision_source::limiter);
      EXPECT_EQ(d->allowed, i < 3) << i;
    }
  }

  // The backend never becomes ready and every check is refused by on_error = deny; the log names
  // the address and `reason`.
  static void expect_refused_with(const redis_options& o, const std::string& reason) {
    log_capture log;
    auto b = make_redis_backend(o);
    ASSERT_TRUE(b) << b.error().message;
    auto r = prepared(**b, three_per_minute);
    const auto until = std::chrono::steady_clock::now() + 5s;
    std::string text;
    while (std::chrono::steady_clock::now() < until) {
      text = log.text();
      if (text.find(reason) != std::string::npos) break;
      std::this_thread::sleep_for(20ms);  // waits for the log line, not for a limiter
    }
    EXPECT_NE(text.find(reason), std::string::npos) << text;
    EXPECT_NE(text.find(o.addresses.front()), std::string::npos) << text;
    EXPECT_FALSE((*b)->ready());
    auto d = (*b)->check({.rule = r.get(), .key = "k"});
    ASSERT_TRUE(d);
    EXPECT_FALSE(d->allowed);
    EXPECT_EQ(d->source, decision_source::fail_closed);
  }

  static certificates* certs_;
};

certificates* RedisTlsTest::certs_ = nullptr;

TEST_F(RedisTlsTest, ChecksAreDecidedOverTls) {
  const int port = testing::free_port();
  auto redis = start(port, false);
  auto b = make_redis_backend(tls_options(port));
  ASSERT_TRUE(b) << b.error().message;
  expect_decided_by_redis(**b, "over-tls");
  EXPECT_TRUE((*b)->ready());
  EXPECT_EQ(redis->keys().size(), 1u) << "the check's state is on the server behind the TLS port";
}

TEST_F(RedisTlsTest, TheServerNameCanDifferFromTheAddress) {
  const int port = testing::free_port();
  auto redis = start(port, false);
  auto o = tls_options(port);
  o.tls_server_name = "redis.test";  // SNI and the name checked: the certificate's DNS name
  auto b = make_redis_backend(o);
  ASSERT_TRUE(b) << b.error().message;
  expect_decided_by_redis(**b, "by-name");
}

TEST_F(RedisTlsTest, MutualTlsNeedsTheClientCertificate) {
  const int port = testing::free_port();
  auto redis = start(port, true);
  auto o = tls_options(port);
  o.tls_cert_file = certs_->path("client.crt");
  o.tls_key_file = certs_->path("client.key");
  auto b = make_redis_backend(o);
  ASSERT_TRUE(b) << b.error().message;
  expect_decided_by_redis(**b, "mutual");

  // Without one the server ends the connection after the handshake: no check reaches it.
  o.tls_cert_file.clear();
  o.tls_key_file.clear();
  expect_refused_with(o, "lost");
}

TEST_F(RedisTlsTest, AnUnknownCaIsRefused) {
  const int port = testing::free_port();
  auto redis = start(port, false);
  auto o = tls_options(port);
  o.tls_ca_file = certs_->path("other_ca.crt");
  expect_refused_with(o, "certificate verify failed: self-signed certificate in certificate chain");
}

TEST_F(RedisTlsTest, AnExpiredCertificateIsRefused) {
  const int port = testing::free_port();
  auto redis = start(port, false, "expired.crt");
  expect_refused_with(tls_options(port), "certificate verify failed: certificate has expired");
}

TEST_F(RedisTlsTest, AWrongNameIsRefused) {
  const int port = testing::free_port();
  auto redis = start(port, false);
  auto o = tls_options(port);
  o.tls_server_name = "elsewhere.test";
  expect_refused_with(o, "certificate verify failed: hostname mismatch");
}

// A Redis Cluster over TLS (bus and replication too), given one seed: the map read over TLS names
// each node's tls-port (a plaintext port would fail the handshake), and a key of each master is
// decided by that master.
TEST_F(RedisTlsTest, AClusterOverTlsIsReachedOnEachNodesTlsPort) {
  const testing::cluster_tls files{certs_->path("server.crt"), certs_->path("server.key"), certs_->path("ca.crt")};
  testing::redis_cluster cluster({}, 3, 1, &files);
  auto o = tls_options(0);
  o.addresses = {cluster.tls_seeds().front()};
  auto b = make_redis_cluster_backend(o);
  ASSERT_TRUE(b) << b.error().message;
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (!(*b)->ready() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(20ms);
  ASSERT_TRUE((*b)->ready());
  EXPECT_EQ((*b)->stats().masters, 3u);
  std::vector<redis_server*> masters = cluster.masters();
  ASSERT_EQ(masters.size(), 3u);
  for (int i = 0; !masters.empty() && i < 1000; ++i) {
    const std::string key = "k" + std::to_string(i);
    const std::string tag = three_per_minute.name + ":" + key;  // keys.hpp: PREFIX{RULE:KEY}:ALG
    redis_server* m = &cluster.master_of(detail::key_slot(tag));
    auto it = std::find(masters.begin(), masters.end(), m);
    if (it == masters.end()) continue;
    masters.erase(it);
    expect_decided_by_redis(**b, key);
    const std::vector<std::string> written = m->keys();
    ASSERT_FALSE(written.empty()) << m->address();
    for (const std::string& k : written) EXPECT_NE(k.find("{" + tag + "}"), std::string::npos) << k;
  }
  EXPECT_TRUE(masters.empty());
}

TEST_F(RedisTlsTest, ChecksAreDecidedWhenTheServersBytesComeOneByOne) {
  // Its handshake and records cut at every byte, by a proxy on the way.
  const int port = testing::free_port();
  auto redis = start(port, false);
  testing::byte_proxy proxy(port);
  auto o = tls_options(0);
  o.addresses = {proxy.address()};
  auto b = make_redis_backend(o);
  ASSERT_TRUE(b) << b.error().message;
  expect_decided_by_redis(**b, "cut");
  EXPECT_GT(proxy.bytes_passed(), 1000u);
}

// Redis Sentinel over TLS: the sentinel reached on its tls-port names the master's tls-port (it
// watches the master over TLS too), and the checks go there over TLS.
TEST_F(RedisTlsTest, ASentinelAndItsMasterOverTls) {
  const int master_port = testing::free_port();
  auto master = start(master_port, false);
  const int sentinel_port = testing::free_port();
  redis_server sentinel({"--sentinel", "--tls-port", std::to_string(sentinel_port), "--tls-cert-file",
                         certs_->path("server.crt"), "--tls-key-file", certs_->path("server.key"), "--tls-ca-cert-file",
                         certs_->path("ca.crt"), "--tls-auth-clients", "no", "--tls-replication", "yes"},
                        nullptr, "sentinel monitor tlsmaster 127.0.0.1 " + std::to_string(master_port) + " 1\n");
  auto o = tls_options(sentinel_port);
  o.master_name = "tlsmaster";
  auto b = make_redis_sentinel_backend(o);
  ASSERT_TRUE(b) << b.error().message;
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (!(*b)->ready() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(20ms);
  ASSERT_TRUE((*b)->ready());
  expect_decided_by_redis(**b, "via-sentinel");
  EXPECT_FALSE(master->keys().empty());
}

TEST_F(RedisTlsTest, NoVerificationAcceptsAnyServer) {
  const int port = testing::free_port();
  auto redis = start(port, false);
  auto o = tls_options(port);
  o.tls_ca_file = certs_->path("other_ca.crt");
  o.tls_verify = false;
  log_capture log;
  auto b = make_redis_backend(o);
  ASSERT_TRUE(b) << b.error().message;
  EXPECT_NE(log.text().find("tls_verify = false"), std::string::npos) << "a warning at start";
  expect_decided_by_redis(**b, "unverified");
}

TEST_F(RedisTlsTest, APlaintextServerOnATlsSettingIsRefused) {
  redis_server plain;
  auto o = tls_options(plain.port());
  expect_refused_with(
      o, "TLS handshake with " + plain.address() + " failed: no answer within connect_timeout (a plaintext port?");
}

TEST_F(RedisTlsTest, ATlsServerOnAPlaintextSettingIsNamed) {
  const int port = testing::free_port();
  auto redis = start(port, false);
  auto o = tls_options(port);
  o.tls = false;
  o.tls_ca_file.clear();
  expect_refused_with(o, "a TLS port? then set tls = true");
}

TEST_F(RedisTlsTest, TlsOptionsAreCheckedAtStart) {
  auto o = tls_options(6379);
  o.tls_cert_file = certs_->path("client.crt");  // without its key
  EXPECT_EQ(make_redis_backend(o).error().code, errc::invalid_argument);
  o.tls_key_file = certs_->path("server.key");  // not its key
  auto b = make_redis_backend(o);
  ASSERT_FALSE(b);
  EXPECT_NE(b.error().message.find("is not the key of"), std::string::npos) << b.error().message;
  o = tls_options(6379);
  o.tls_ca_file = certs_->path("missing.crt");
  b = make_redis_backend(o);
  ASSERT_FALSE(b);
  EXPECT_NE(b.error().message.find("tls_ca_file"), std::string::npos) << b.error().message;
  o = tls_options(6379);
  o.tls = false;  // a CA file without TLS is a mistake, not a setting
  EXPECT_EQ(make_redis_backend(o).error().code, errc::invalid_argument);
}

// The ACL the README documents: sluice's keys and the commands it and its scripts call, nothing else.
TEST(RedisAclTest, AUserWithTheMinimalAclChecksAndOneWithoutScriptsIsNamed) {
  redis_server redis;
  const std::string minimal =
      "on >pw resetkeys ~sluice:* resetchannels -@all +evalsha +eval +script|load +time +ping +get +set +del "
      "+pexpire +setrange +zadd +zincrby +zrange +zrangebyscore +zremrangebyrank";
  std::vector<std::string> acl = {"ACL", "SETUSER", "sluice"};
  std::istringstream words(minimal);
  for (std::string w; words >> w;) acl.push_back(w);
  ASSERT_EQ(redis.string(acl), "OK");
  redis_options o{.addresses = {redis.address()},
                  .username = "sluice",
                  .password = "pw",
                  .command_timeout = 2000ms,
                  .on_error = failure_policy::deny,
                  .error_log_interval = 10ms};
  {
    auto b = make_redis_backend(o);
    ASSERT_TRUE(b) << b.error().message;
    for (const rule& r : {rule{.name = "fw", .limit = fixed_window_policy(3, 60s)},
                          rule{.name = "tb", .limit = token_bucket_policy(per_second(1), 3)},
                          rule{.name = "log", .limit = sliding_window_policy(3, 60s)},
                          rule{.name = "counter", .limit = sliding_window_counter_policy(3, 60s)}}) {
      auto p = prepared(**b, r);
      for (int i = 0; i < 4; ++i) {
        auto d = (*b)->check({.rule = p.get(), .key = "k"});
        ASSERT_TRUE(d) << d.error().message;
        EXPECT_EQ(d->source, decision_source::limiter) << r.name;
        EXPECT_EQ(d->allowed, i < 3) << r.name << " " << i;
      }
    }
  }
  ASSERT_EQ(redis.string({"ACL", "SETUSER", "sluice", "-script|load", "-eval", "-evalsha"}), "OK");
  log_capture log;
  auto b = make_redis_backend(o);
  ASSERT_TRUE(b);
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (std::chrono::steady_clock::now() < until && log.text().find("NOPERM") == std::string::npos) {
    std::this_thread::sleep_for(20ms);  // waits for the log line, not for a limiter
  }
  EXPECT_NE(log.text().find("SCRIPT LOAD failed on " + redis.address() + ": NOPERM"), std::string::npos) << log.text();
  EXPECT_FALSE((*b)->ready());
}

}  // namespace
}  // namespace sluice
