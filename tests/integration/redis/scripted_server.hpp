// SPDX-License-Identifier: Apache-2.0
// tests/integration/redis/scripted_server.hpp — not Redis: a server on 127.0.0.1 that answers each
// RESP command with what the test's function returns for it (its name and first argument), for
// tests of replies no real server sends or of servers that lie (a sentinel naming a replica).
// Reads RESP commands just well enough for that; serves any number of connections at once, on one
// thread, until destroyed.
//
//   scripted_server s([](const std::vector<std::string>& command) {
//     return command.front() == "PING" ? std::string("+PONG\r\n") : std::string("+OK\r\n");
//   });
//   redis_options o{.addresses = {s.address()}};
//
// Thread-safe: connections() from any thread; the function runs on the server's thread.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "integration/free_port.hpp"

namespace sluice::testing {

class scripted_server {
 public:
  /// A command's name and first argument (as many as it has, up to two): the reply, in RESP.
  using reply_fn = std::function<std::string(const std::vector<std::string>& command)>;

  explicit scripted_server(reply_fn reply) : reply_(std::move(reply)) {
    listener_ = listen_on_loopback(port_);
    if (listener_ < 0) ADD_FAILURE() << "cannot listen on 127.0.0.1";
    thread_ = std::thread([this] { serve(); });
  }
  ~scripted_server() {
    stop_ = true;
    thread_.join();
    ::close(listener_);
  }
  scripted_server(const scripted_server&) = delete;
  scripted_server& operator=(const scripted_server&) = delete;

  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  /// Connections accepted so far.
  int connections() const { return connections_.load(); }

 private:
  struct client {
    int fd;
    std::string in;
  };

  // Polls (bounded, so that stop_ is seen) the listener and every client.
  void serve() {
    std::vector<client> clients;
    while (!stop_) {
      std::vector<pollfd> fds{{listener_, POLLIN, 0}};
      for (const client& c : clients) fds.push_back({c.fd, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), 20) <= 0) continue;
      for (std::size_t i = clients.size(); i-- > 0;) {
        if ((fds[i + 1].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
        if (!answer(clients[i])) {
          ::close(clients[i].fd);
          clients.erase(clients.begin() + static_cast<std::ptrdiff_t>(i));
        }
      }
      if ((fds[0].revents & POLLIN) != 0) {
        const int fd = ::accept(listener_, nullptr, nullptr);
        if (fd >= 0) {
          connections_.fetch_add(1);
          clients.push_back({fd, {}});
        }
      }
    }
    for (const client& c : clients) ::close(c.fd);
  }

  // Reads what came and answers every whole command in it; false when the client is gone.
  bool answer(client& c) {
    char buf[4096];
    const ssize_t n = ::read(c.fd, buf, sizeof buf);
    if (n <= 0) return false;
    c.in.append(buf, static_cast<std::size_t>(n));
    std::string out;  // in one send: no small segment waits for another's ACK
    while (auto command = next_command(c.in)) out += reply_(*command);
    return out.empty() || ::send(c.fd, out.data(), out.size(), MSG_NOSIGNAL) >= 0;
  }

  // The first whole command in `in` (its name and first argument), which it then drops; nullopt
  // until one is whole.
  static std::optional<std::vector<std::string>> next_command(std::string& in) {
    std::size_t at = 0;
    auto number = [&](char lead) -> std::optional<long> {
      const std::size_t crlf = in.find("\r\n", at);
      if (at >= in.size() || in[at] != lead || crlf == std::string::npos) return std::nullopt;
      const long n = std::stol(in.substr(at + 1, crlf - at - 1));
      at = crlf + 2;
      return n;
    };
    const auto argc = number('*');
    if (!argc || *argc < 1) return std::nullopt;
    std::vector<std::string> args;
    for (long i = 0; i < *argc; ++i) {
      const auto len = number('$');
      if (!len || at + static_cast<std::size_t>(*len) + 2 > in.size()) return std::nullopt;
      if (i < 2) args.push_back(in.substr(at, static_cast<std::size_t>(*len)));
      at += static_cast<std::size_t>(*len) + 2;
    }
    in.erase(0, at);
    return args;
  }

  const reply_fn reply_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::thread thread_;
};

}  // namespace sluice::testing
