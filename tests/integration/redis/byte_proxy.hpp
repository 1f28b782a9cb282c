// SPDX-License-Identifier: Apache-2.0
// tests/integration/redis/byte_proxy.hpp — a TCP proxy on 127.0.0.1 in front of a real server that
// passes what the client sends as it comes, and what the server answers one byte per write, with a
// pause after each: the client's reader meets every reply cut at every byte.
//
//   redis_server redis;
//   byte_proxy proxy(redis.port());
//   auto b = sluice::make_redis_backend({.addresses = {proxy.address()}});
//
// Serves any number of connections on one thread until destroyed. Thread-safe: bytes_passed() from
// any thread.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "integration/free_port.hpp"

namespace sluice::testing {

class byte_proxy {
 public:
  explicit byte_proxy(int target_port) : target_port_(target_port) {
    listener_ = listen_on_loopback(port_);
    if (listener_ < 0) ADD_FAILURE() << "cannot listen on 127.0.0.1";
    thread_ = std::thread([this] { serve(); });
  }
  ~byte_proxy() {
    stop_ = true;
    thread_.join();
    for (const link& l : links_) {
      ::close(l.client);
      ::close(l.server);
    }
    ::close(listener_);
  }
  byte_proxy(const byte_proxy&) = delete;
  byte_proxy& operator=(const byte_proxy&) = delete;

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  /// Bytes of the server's passed to clients so far, each in a write of its own.
  std::size_t bytes_passed() const { return bytes_passed_.load(); }

 private:
  struct link {
    int client, server;
    std::string to_client;  // the server's bytes not yet passed on
    bool open = true;
  };

  static sockaddr_in loopback(int port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    return a;
  }

  void accept_one() {
    const int client = ::accept(listener_, nullptr, nullptr);
    if (client < 0) return;
    const int server = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in to = loopback(target_port_);
    if (::connect(server, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
      ::close(client);
      ::close(server);
      return;
    }
    const int one = 1;
    ::setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // each byte its own segment
    links_.push_back({client, server, {}});
  }

  // From `from` to `to` whatever has come (false: closed).
  static bool relay(int from, int to) {
    char buf[65536];
    const ssize_t n = ::recv(from, buf, sizeof buf, 0);
    if (n <= 0) return false;
    for (ssize_t at = 0; at < n;) {
      const ssize_t w = ::send(to, buf + at, static_cast<std::size_t>(n - at), MSG_NOSIGNAL);
      if (w <= 0) return false;
      at += w;
    }
    return true;
  }

  void serve() {
    while (!stop_) {
      std::vector<pollfd> fds{{listener_, POLLIN, 0}};
      for (const link& l : links_) {
        fds.push_back({l.open ? l.client : -1, POLLIN, 0});
        fds.push_back({l.open ? l.server : -1, static_cast<short>(l.to_client.size() < (1 << 20) ? POLLIN : 0), 0});
      }
      bool pending = false;
      for (const link& l : links_) pending = pending || (l.open && !l.to_client.empty());
      ::poll(fds.data(), fds.size(), pending ? 0 : 10);
      if (fds[0].revents & POLLIN) accept_one();
      for (std::size_t i = 0; i < links_.size() && 1 + 2 * i + 1 < fds.size(); ++i) {
        link& l = links_[i];
        if (!l.open) continue;
        if ((fds[1 + 2 * i].revents & (POLLIN | POLLHUP)) && !relay(l.client, l.server)) l.open = false;
        if (fds[2 + 2 * i].revents & (POLLIN | POLLHUP)) {
          char buf[65536];
          const ssize_t n = ::recv(l.server, buf, sizeof buf, 0);
          if (n <= 0) l.open = false;
          if (n > 0) l.to_client.append(buf, static_cast<std::size_t>(n));
        }
        if (!l.open) {
          ::shutdown(l.client, SHUT_RDWR);
          continue;
        }
        // One byte, then a pause long enough for the client to read it alone.
        if (!l.to_client.empty() && ::send(l.client, l.to_client.data(), 1, MSG_NOSIGNAL) == 1) {
          l.to_client.erase(0, 1);
          ++bytes_passed_;
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
      }
    }
  }

  const int target_port_;
  int listener_ = -1;
  int port_ = 0;
  std::vector<link> links_;  // server thread only
  std::atomic<std::size_t> bytes_passed_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace sluice::testing
