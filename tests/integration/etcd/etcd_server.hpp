// SPDX-License-Identifier: Apache-2.0
// tests/integration/etcd/etcd_server.hpp — a real single-member etcd for tests.
//
// Starts /usr/bin/etcd on free 127.0.0.1 client and peer ports with its data in a fresh temporary
// directory (in /dev/shm when there is one: etcd syncs its log on every write), waits until it
// answers, and kills it — by its PID, only that one — at the end, removing the directory. It
// restarts on the same ports and data, or on another client port, out of reach of clients of
// `endpoint()`. etcdctl (ETCDCTL_API=3) changes keys, compacts and sets up authentication; with
// `transport::tls` the test makes a CA, a server and a client certificate with the openssl CLI,
// and etcd requires client certificates.
//
//   sluice::testing::etcd_server etcd;              // started
//   std::int64_t rev = etcd.put("/sluice/a", "1");  // the revision of the put
//   etcd.kill(); etcd.restart();
//   etcd.enable_auth("root-password");              // later etcdctl calls authenticate as root
//
// Not thread-safe.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "integration/free_port.hpp"
#include "integration/run_command.hpp"

namespace sluice::testing {

class etcd_server {
 public:
  enum class transport { plaintext, tls };

  explicit etcd_server(transport t = transport::plaintext) : tls_(t == transport::tls) {
    const std::filesystem::path base = std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : "/tmp";
    std::string tmpl = (base / "sluice-etcd-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
    name_ = "sluice-test-" + std::to_string(::getpid()) + "-" + dir_.filename().string();
    if (tls_) make_certificates();
    for (int attempt = 0; attempt < 5; ++attempt) {
      home_port_ = free_port();
      do {
        peer_port_ = free_port();
      } while (peer_port_ == home_port_);
      std::filesystem::remove_all(dir_ / "data");
      if (start(home_port_)) return;
    }
    throw std::runtime_error("etcd did not start; see " + (dir_ / "etcd.log").string());
  }

  etcd_server(const etcd_server&) = delete;
  etcd_server& operator=(const etcd_server&) = delete;

  ~etcd_server() {
    kill();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  /// "127.0.0.1:PORT", the client port it was started on.
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(home_port_); }
  pid_t pid() const { return pid_; }
  const std::filesystem::path& dir() const { return dir_; }

  /// PEM files made for transport::tls: the CA, and a client certificate and key it signed.
  std::string ca_file() const { return (dir_ / "ca.crt").string(); }
  std::string client_cert_file() const { return (dir_ / "client.crt").string(); }
  std::string client_key_file() const { return (dir_ / "client.key").string(); }

  /// SIGKILL, and reap it.
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  /// Starts it again (after kill()) on the same ports and data.
  void restart() { restart_on(home_port_); }

  /// Starts it again (after kill()) on the same data and peer port but another client port, so
  /// clients of endpoint() cannot reach it; this fixture's etcdctl calls still do.
  void restart_out_of_reach() {
    int port = 0;
    do {
      port = free_port();
    } while (port == home_port_ || port == peer_port_);
    restart_on(port);
  }

  /// Runs etcdctl against the running server (as root once auth is enabled); throws when it fails.
  std::string etcdctl(const std::vector<std::string>& args, const std::string& input = {}) const {
    auto r = try_etcdctl(args, input);
    if (r.exit_code != 0) throw std::runtime_error("etcdctl " + args.front() + " failed: " + r.output);
    return r.output;
  }

  command_result try_etcdctl(const std::vector<std::string>& args, const std::string& input = {}) const {
    std::vector<std::string> argv = {"/usr/bin/etcdctl", "--endpoints", scheme() + "127.0.0.1:" + std::to_string(port_),
                                     "--dial-timeout=2s", "--command-timeout=10s"};
    if (tls_) {
      argv.insert(argv.end(), {"--cacert", ca_file(), "--cert", client_cert_file(), "--key", client_key_file()});
    }
    if (!root_password_.empty()) argv.insert(argv.end(), {"--user", "root:" + root_password_});
    argv.insert(argv.end(), args.begin(), args.end());
    return run_command(argv, {"ETCDCTL_API=3"}, input);
  }

  /// Sets `key` to `value`; returns the revision of the change.
  std::int64_t put(const std::string& key, const std::string& value) const {
    return header_revision(etcdctl({"put", "-w", "json", key}, value));
  }

  /// Deletes `key`; returns the store's revision after it.
  std::int64_t del(const std::string& key) const { return header_revision(etcdctl({"del", "-w", "json", key})); }

  /// The store's current revision.
  std::int64_t revision() const { return header_revision(etcdctl({"get", "-w", "json", "--count-only", "x"})); }

  /// Compacts the history up to `revision` (physically, before returning).
  void compact(std::int64_t revision) const { etcdctl({"compact", "--physical", std::to_string(revision)}); }

  /// Creates root (role root) with `root_password` and turns authentication on; later etcdctl
  /// calls of this fixture authenticate as root.
  void enable_auth(const std::string& root_password) {
    etcdctl({"user", "add", "root:" + root_password});
    etcdctl({"role", "add", "root"});
    etcdctl({"user", "grant-role", "root", "root"});
    etcdctl({"auth", "enable"});
    root_password_ = root_password;
  }

  /// A user that may read every key under `prefix` (and nothing else).
  void add_reader(const std::string& user, const std::string& password, const std::string& prefix) const {
    etcdctl({"role", "add", user + "-reader"});
    etcdctl({"role", "grant-permission", user + "-reader", "--prefix=true", "read", prefix});
    etcdctl({"user", "add", user + ":" + password});
    etcdctl({"user", "grant-role", user, user + "-reader"});
  }

 private:
  std::string scheme() const { return tls_ ? "https://" : "http://"; }

  static std::int64_t header_revision(const std::string& json) {
    const auto at = json.find("\"revision\":");
    if (at == std::string::npos) throw std::runtime_error("no revision in: " + json);
    return std::stoll(json.substr(at + 11));
  }

  void restart_on(int port) {
    for (int attempt = 0; attempt < 20; ++attempt) {
      if (start(port)) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // a port not yet released
    }
    throw std::runtime_error("etcd did not restart; see " + (dir_ / "etcd.log").string());
  }

  bool start(int client_port) {
    port_ = client_port;
    const std::string client = scheme() + "127.0.0.1:" + std::to_string(client_port);
    const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
    std::vector<std::string> args = {"/usr/bin/etcd",
                                     "--name",
                                     name_,
                                     "--data-dir",
                                     (dir_ / "data").string(),
                                     "--listen-client-urls",
                                     client,
                                     "--advertise-client-urls",
                                     client,
                                     "--listen-peer-urls",
                                     peer,
                                     "--initial-advertise-peer-urls",
                                     peer,
                                     "--initial-cluster",
                                     name_ + "=" + peer,
                                     "--log-level",
                                     "warn"};
    if (tls_) {
      args.insert(args.end(), {"--cert-file", (dir_ / "server.crt").string(), "--key-file",
                               (dir_ / "server.key").string(), "--trusted-ca-file", ca_file(), "--client-cert-auth"});
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string log = (dir_ / "etcd.log").string();
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      ::dup2(fd, STDOUT_FILENO);
      ::dup2(fd, STDERR_FILENO);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    pid_ = pid;
    // Up (it commits a read), and ours: another test's etcd could have taken the port.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {  // exited: a port taken?
        pid_ = -1;
        return false;
      }
      auto members = try_etcdctl({"member", "list"});
      if (members.exit_code == 0 && members.output.find(name_) != std::string::npos &&
          try_etcdctl({"endpoint", "health"}).exit_code == 0) {
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // waiting for a process to start
    }
    kill();
    return false;
  }

  void make_certificates() const {
    const std::string d = dir_.string() + "/";
    auto openssl = [](std::vector<std::string> args) {
      args.insert(args.begin(), "/usr/bin/openssl");
      auto r = run_command(args);
      if (r.exit_code != 0) throw std::runtime_error("openssl " + args[1] + " failed: " + r.output);
    };
    const std::vector<std::string> ec_key = {"-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"};
    auto request = [&](const std::string& name, const std::string& subject) {
      std::vector<std::string> a = {"req"};
      a.insert(a.end(), ec_key.begin(), ec_key.end());
      a.insert(a.end(), {"-keyout", d + name + ".key", "-out", d + name + ".csr", "-subj", subject});
      openssl(a);
    };
    auto sign = [&](const std::string& name, const std::string& extensions) {
      std::ofstream(d + name + ".ext") << extensions;
      openssl({"x509", "-req", "-in", d + name + ".csr", "-CA", d + "ca.crt", "-CAkey", d + "ca.key", "-CAcreateserial",
               "-days", "2", "-out", d + name + ".crt", "-extfile", d + name + ".ext"});
    };
    std::vector<std::string> ca = {"req", "-x509"};
    ca.insert(ca.end(), ec_key.begin(), ec_key.end());
    ca.insert(ca.end(), {"-keyout", d + "ca.key", "-out", d + "ca.crt", "-subj", "/CN=sluice test CA", "-days", "2"});
    openssl(ca);
    request("server", "/CN=127.0.0.1");
    sign("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n");
    request("client", "/CN=sluice");
    sign("client", "extendedKeyUsage=clientAuth\n");
  }

  const bool tls_;
  std::filesystem::path dir_;
  std::string name_;
  int home_port_ = 0;  // the client port of endpoint()
  int port_ = 0;       // the client port it listens on now
  int peer_port_ = 0;
  pid_t pid_ = -1;
  std::string root_password_;
};

}  // namespace sluice::testing
