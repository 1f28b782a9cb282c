// SPDX-License-Identifier: Apache-2.0
// Test utilities for the HTTP middleware tests: start a real binary and talk HTTP/1.1 to it over a
// real socket. Processes are ended by PID, never by name.
//
//   child server({NOTES_BEAST, "--listen", "127.0.0.1:0"});
//   auto r = http_get(server.port(), "/public");
//   EXPECT_EQ(r.status, 200);
//
// Not thread-safe.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "integration/free_port.hpp"

namespace sluice::testing {

/// A child process whose stdout we read; killed (SIGTERM, then SIGKILL) and reaped on destruction.
class child {
 public:
  /// What happens to the child's stdout: read by the test, or thrown away (servers that log a lot).
  enum class output { capture, discard };

  explicit child(std::vector<std::string> argv, output out = output::capture) {
    int fds[2];
    if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      if (out == output::discard) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, STDOUT_FILENO);
      } else {
        dup2(fds[1], STDOUT_FILENO);
      }
      close(fds[0]);
      close(fds[1]);
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    close(fds[1]);
    out_ = fds[0];
  }
  child(const child&) = delete;
  child& operator=(const child&) = delete;
  ~child() {
    stop();
    if (out_ >= 0) close(out_);
  }

  pid_t pid() const { return pid_; }

  /// Reads one line of stdout, waiting at most `timeout`; empty on timeout or EOF.
  std::string read_line(std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      auto nl = buffer_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return line;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return {};
      pollfd p{out_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) return {};
      char buf[512];
      ssize_t n = read(out_, buf, sizeof buf);
      if (n <= 0) return {};
      buffer_.append(buf, static_cast<std::size_t>(n));
    }
  }

  /// The port named by the "listening on http://HOST:PORT" line (read once; other lines, such as
  /// log lines, are skipped).
  int port() {
    for (int lines = 0; port_ == 0 && lines < 100; ++lines) {
      std::string line = read_line();
      if (line.empty()) throw std::runtime_error("child did not report its port");
      auto colon = line.rfind(':');
      if (line.rfind("listening on", 0) == 0 && colon != std::string::npos) port_ = std::stoi(line.substr(colon + 1));
    }
    if (port_ == 0) throw std::runtime_error("child did not report its port");
    return port_;
  }

  /// Ends the process (SIGTERM, SIGKILL after 5 s) and reaps it.
  void stop(int signal = SIGTERM) {
    if (pid_ <= 0) return;
    kill(pid_, signal);
    for (int i = 0; i < 500; ++i) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // waiting for a process to exit, not a limiter
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  std::string buffer_;
  int port_ = 0;
};

struct http_response {
  int status = 0;                              ///< 0: no response (connection failed or closed).
  std::map<std::string, std::string> headers;  ///< Lower-case names.
  std::string body;

  bool has(const std::string& lower_name) const { return headers.count(lower_name) != 0; }
  std::string header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? std::string() : it->second;
  }
};

struct http_request {
  std::string method = "GET";
  std::string target = "/";
  std::vector<std::pair<std::string, std::string>> headers{};
  std::string body{};
  std::string from = "127.0.0.1";  ///< Local address the client binds (any of 127.0.0.0/8).
};

/// One request on a fresh connection ("Connection: close"); reads the response to EOF.
inline http_response http(int port, const http_request& req) {
  http_response res;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return res;
  sockaddr_in local{};
  local.sin_family = AF_INET;
  inet_pton(AF_INET, req.from.c_str(), &local.sin_addr);
  sockaddr_in remote{};
  remote.sin_family = AF_INET;
  remote.sin_port = htons(static_cast<std::uint16_t>(port));
  remote.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0 ||
      connect(fd, reinterpret_cast<sockaddr*>(&remote), sizeof remote) != 0) {
    close(fd);
    return res;
  }
  std::string out = req.method + " " + req.target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  for (const auto& [k, v] : req.headers) out += k + ": " + v + "\r\n";
  bool chunked = false;  // the body is then sent as given, framing included
  for (const auto& h : req.headers) chunked = chunked || h.first == "Transfer-Encoding";
  if (!chunked && (!req.body.empty() || req.method == "POST")) {
    out += "Content-Length: " + std::to_string(req.body.size()) + "\r\n";
  }
  out += "\r\n" + req.body;
  for (std::size_t sent = 0; sent < out.size();) {
    ssize_t n = send(fd, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<std::size_t>(n);
  }
  std::string in;
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;) in.append(buf, static_cast<std::size_t>(n));
  close(fd);

  auto head_end = in.find("\r\n\r\n");
  if (in.compare(0, 9, "HTTP/1.1 ") != 0 || head_end == std::string::npos) return res;
  res.status = std::atoi(in.c_str() + 9);
  std::size_t pos = in.find("\r\n") + 2;
  while (pos < head_end) {
    auto eol = in.find("\r\n", pos);
    std::string line = in.substr(pos, eol - pos);
    pos = eol + 2;
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    std::string value = line.substr(colon + 1);
    while (!value.empty() && value.front() == ' ') value.erase(0, 1);
    res.headers[name] = value;
  }
  res.body = in.substr(head_end + 4);
  return res;
}

inline http_response http_get(int port, const std::string& target,
                              std::vector<std::pair<std::string, std::string>> headers = {},
                              const std::string& from = "127.0.0.1") {
  return http(port, {.method = "GET", .target = target, .headers = std::move(headers), .from = from});
}

/// Sends `make()` requests until one is refused (429) or `bound` were sent. Returns the number
/// admitted (2xx) before the refusal, and the refusal itself (status 0 when none came).
struct exhaust_result {
  int admitted = 0;
  int other = 0;  ///< Neither 2xx nor 429.
  http_response refusal;
};

template <class MakeRequest>
exhaust_result exhaust(int port, MakeRequest make, int bound = 200) {
  exhaust_result r;
  for (int i = 0; i < bound; ++i) {
    http_response res = http(port, make(i));
    if (res.status == 429) {
      r.refusal = std::move(res);
      return r;
    }
    if (res.status >= 200 && res.status < 300) {
      ++r.admitted;
    } else {
      ++r.other;
    }
  }
  return r;
}

}  // namespace sluice::testing
