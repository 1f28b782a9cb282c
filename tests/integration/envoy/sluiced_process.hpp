// SPDX-License-Identifier: Apache-2.0
// tests/integration/envoy/sluiced_process.hpp — a real sluiced for tests, with its config file and
// Envoy YAML directory in a fresh temporary directory.
//
// Starts the sluiced binary (SLUICED_PATH) on 127.0.0.1 with HTTP and gRPC on ports it picks,
// waits until both listen (its log says where), and ends it (by its PID, only that one) at the end.
//
//   sluiced_process s(toml_without_listen_lines, {{"edge.yaml", yaml}});
//   auto stub = s.stub();           // envoy.service.ratelimit.v3.RateLimitService
//   s.write_yaml("edge.yaml", ...); s.wait_for_log("event=envoy_config result=success", 2);
//
// Not thread-safe.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "envoy/service/ratelimit/v3/rls.grpc.pb.h"

namespace sluice::testing {

class sluiced_process {
 public:
  /// `toml`: the config file but for [server] listen and grpc_listen (added here) and [envoy]
  /// config_dir (set to the YAML directory when `toml` has an [envoy] section).
  sluiced_process(const std::string& toml, const std::map<std::string, std::string>& yaml_files,
                  bool expect_start = true) {
    char tmpl[] = "/tmp/sluiced-envoy-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
    std::filesystem::create_directories(dir_ / "envoy");
    for (const auto& [name, text] : yaml_files) write_yaml(name, text);
    std::string config = toml;
    const std::string section = "[envoy]\n";
    if (auto at = config.find(section); at != std::string::npos) {
      config.insert(at + section.size(), "config_dir = \"envoy\"\n");
    }
    const std::string server = "[server]\n";
    if (auto at = config.find(server); at != std::string::npos) {
      config.insert(at + server.size(), "grpc_listen = \"127.0.0.1:0\"\n");
    } else {
      config = server + "grpc_listen = \"127.0.0.1:0\"\n" + config;
    }
    std::ofstream(dir_ / "sluice.toml") << config;
    start();
    if (expect_start) {
      const std::string grpc = wait_for_log(R"(event=grpc_listening address=\S+ port=(\d+))");
      const std::string http = wait_for_log(R"(event=listening address=127\.0\.0\.1:(\d+))");
      grpc_port_ = std::stoi(grpc);
      http_port_ = std::stoi(http);
    }
  }
  sluiced_process(const sluiced_process&) = delete;
  sluiced_process& operator=(const sluiced_process&) = delete;
  ~sluiced_process() {
    stop();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  /// Writes (or replaces) a file of the YAML directory, whole: written aside, then renamed.
  void write_yaml(const std::string& name, const std::string& text) {
    const auto tmp = dir_ / "envoy" / (".tmp-" + name + ".part");
    std::ofstream(tmp) << text;
    std::filesystem::rename(tmp, dir_ / "envoy" / name);
  }

  std::unique_ptr<::envoy::service::ratelimit::v3::RateLimitService::Stub> stub() const {
    auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(grpc_port_), grpc::InsecureChannelCredentials());
    return ::envoy::service::ratelimit::v3::RateLimitService::NewStub(channel);
  }

  int grpc_port() const { return grpc_port_; }
  int http_port() const { return http_port_; }
  std::string log() const {
    std::ifstream in(dir_ / "sluiced.log");
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  /// Waits (20 s at most) until the log has `occurrence` matches of `pattern`; returns the last
  /// match's first group (or the whole match).
  std::string wait_for_log(const std::string& pattern, int occurrence = 1) const {
    const std::regex re(pattern);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      const std::string text = log();
      int seen = 0;
      for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it) {
        if (++seen == occurrence) return (*it).size() > 1 ? (*it)[1].str() : (*it)[0].str();
      }
      if (!running()) throw std::runtime_error("sluiced exited:\n" + text);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    throw std::runtime_error("not in sluiced's log after 20 s: " + pattern + "\n" + log());
  }

  bool running() const {
    if (pid_ <= 0) return false;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == 0) return true;
    const_cast<sluiced_process*>(this)->exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    const_cast<sluiced_process*>(this)->pid_ = -1;
    return false;
  }
  /// The exit status once it has ended by itself (waits 20 s at most); -1 if killed.
  int wait_exit() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (running() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return exit_code_;
  }

  /// GET `path` on the HTTP port; the whole response.
  std::string http_get(const std::string& path) const {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(http_port_));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::string out;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      const std::string req = "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
      (void)::write(fd, req.data(), req.size());
      char buf[8192];
      for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
    }
    ::close(fd);
    return out;
  }

 private:
  void start() {
    const std::string binary = SLUICED_PATH;
    const std::string config = (dir_ / "sluice.toml").string();
    const std::string log_path = (dir_ / "sluiced.log").string();
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlives the test
      const int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(log, STDOUT_FILENO);
      ::dup2(log, STDERR_FILENO);
      ::execl(binary.c_str(), binary.c_str(), "--config", config.c_str(), "--listen", "127.0.0.1:0",
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }

  void stop() {
    if (!running()) return;
    ::kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (running() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (running()) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }

  std::filesystem::path dir_;
  pid_t pid_ = -1;
  int exit_code_ = -1;
  int grpc_port_ = 0;
  int http_port_ = 0;
};

}  // namespace sluice::testing
