// SPDX-License-Identifier: Apache-2.0
// tests/integration/redis/redis_server.hpp — a real redis-server for tests.
//
// Starts /usr/bin/redis-server on a free 127.0.0.1 port in a fresh temporary directory, with no
// persistence, waits until it answers PING, and kills it (by its PID, only that one) at the end.
// `command()` talks to it synchronously for inspection (TTL, SCRIPT FLUSH, DEBUG SLEEP, INFO).
//
//   sluice::testing::redis_server redis;                 // started
//   auto backend = sluice::make_redis_backend({.addresses = {redis.address()}});
//   redis.command({"SCRIPT", "FLUSH"});
//   redis.kill(); redis.restart();
//
// Not thread-safe, except that `command` may be used from one other thread at a time.
#pragma once

#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <stdexcept>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "integration/free_port.hpp"

namespace sluice::testing {

struct reply_deleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using reply_ptr = std::unique_ptr<redisReply, reply_deleter>;

class redis_server {
 public:
  /// `extra` is appended to the redis-server command line, e.g. {"--requirepass", "pw"}; a port
  /// is taken only when `port_ok` (if given) accepts it (a cluster node needs port + 10000 too).
  /// `config`, when not empty, is written to a config file given first (a sentinel, with
  /// "--sentinel" in `extra`, needs one it can rewrite).
  explicit redis_server(std::vector<std::string> extra = {}, std::function<bool(int)> port_ok = {},
                        const std::string& config = {})
      : extra_(std::move(extra)) {
    char tmpl[] = "/tmp/sluice-redis-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
    if (!config.empty()) {
      config_file_ = (dir_ / "redis.conf").string();
      std::FILE* f = std::fopen(config_file_.c_str(), "w");
      if (f == nullptr) throw std::runtime_error("cannot write " + config_file_);
      std::fputs(config.c_str(), f);
      std::fclose(f);
    }
    for (int attempt = 0; attempt < 20; ++attempt) {
      port_ = free_port();
      if (port_ok && !port_ok(port_)) continue;
      if (start()) return;
    }
    throw std::runtime_error("redis-server did not start");
  }

  redis_server(const redis_server&) = delete;
  redis_server& operator=(const redis_server&) = delete;

  ~redis_server() {
    ctx_.reset();
    stop(SIGKILL);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  pid_t pid() const { return pid_; }

  /// SIGKILL, and reap it.
  void kill() {
    ctx_.reset();
    stop(SIGKILL);
  }

  /// Starts it again on the same port (after kill()).
  void restart() {
    for (int attempt = 0; attempt < 20; ++attempt) {
      if (start()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    throw std::runtime_error("redis-server did not restart");
  }

  /// Runs one command on the test's own connection (authenticated with `password` if set).
  reply_ptr command(const std::vector<std::string>& args) {
    if (!ctx_) ctx_ = connect();
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    auto* r =
        static_cast<redisReply*>(redisCommandArgv(ctx_.get(), static_cast<int>(argv.size()), argv.data(), lens.data()));
    if (r == nullptr) {
      ctx_.reset();
      throw std::runtime_error("redis command failed");
    }
    return reply_ptr(r);
  }

  long long integer(const std::vector<std::string>& args) {
    auto r = command(args);
    if (r->type != REDIS_REPLY_INTEGER) throw std::runtime_error("not an integer reply: " + args.front());
    return r->integer;
  }

  std::string string(const std::vector<std::string>& args) {
    auto r = command(args);
    if (r->type != REDIS_REPLY_STRING && r->type != REDIS_REPLY_STATUS) {
      throw std::runtime_error("not a string reply: " + args.front());
    }
    return std::string(r->str, r->len);
  }

  /// All keys (SCAN; the test databases are small).
  /// Units recorded by a sliding-window-log key: its newest entry's running total minus its oldest
  /// entry's start (scripts.cpp: score = total, member = doubles time, start, ...); 0 for no key.
  long long log_units(const std::string& key) {
    reply_ptr oldest = command({"ZRANGE", key, "0", "0"});
    reply_ptr newest = command({"ZRANGE", key, "-1", "-1", "WITHSCORES"});
    if (oldest->type != REDIS_REPLY_ARRAY || oldest->elements == 0 || newest->elements != 2) return 0;
    if (oldest->element[0]->len != 32) return -1;
    double start = 0;  // the member's second little-endian double (x86-64: native order)
    std::memcpy(&start, oldest->element[0]->str + 8, sizeof start);
    return std::stoll(std::string(newest->element[1]->str, newest->element[1]->len)) - static_cast<long long>(start);
  }

  std::vector<std::string> keys() {
    std::vector<std::string> out;
    std::string cursor = "0";
    for (int i = 0; i < 100'000; ++i) {
      auto r = command({"SCAN", cursor, "COUNT", "1000"});
      cursor = std::string(r->element[0]->str, r->element[0]->len);
      for (size_t j = 0; j < r->element[1]->elements; ++j) {
        out.emplace_back(r->element[1]->element[j]->str, r->element[1]->element[j]->len);
      }
      if (cursor == "0") break;
    }
    return out;
  }

  /// The next command() connects anew: for after something closed the clients' connections (a
  /// sentinel that reconfigures the server kills them).
  void reconnect() { ctx_.reset(); }

  /// Password the test connection uses (after CONFIG/ACL changes).
  void set_password(std::string user, std::string password) {
    user_ = std::move(user);
    password_ = std::move(password);
    ctx_.reset();
  }

 private:
  struct context_deleter {
    void operator()(redisContext* c) const { redisFree(c); }
  };
  using context_ptr = std::unique_ptr<redisContext, context_deleter>;

  context_ptr connect() {
    timeval tv{2, 0};
    context_ptr c(redisConnectWithTimeout("127.0.0.1", port_, tv));
    if (!c || c->err) throw std::runtime_error("cannot connect to the test redis-server");
    if (!password_.empty()) {
      void* r = user_.empty() ? redisCommand(c.get(), "AUTH %s", password_.c_str())
                              : redisCommand(c.get(), "AUTH %s %s", user_.c_str(), password_.c_str());
      if (r) freeReplyObject(r);
    }
    return c;
  }

  bool start() {
    std::vector<std::string> args = {"/usr/bin/redis-server"};
    if (!config_file_.empty()) args.push_back(config_file_);
    args.insert(args.end(), {"--port", std::to_string(port_), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", dir_.string(), "--enable-debug-command", "local", "--daemonize", "no",
                             "--logfile", (dir_ / "redis.log").string()});
    for (const auto& e : extra_) args.push_back(e);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      // Dies with the test (even one that crashed), and leaves the test's output to the test.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      const int devnull = ::open("/dev/null", O_WRONLY);
      ::dup2(devnull, STDOUT_FILENO);
      ::dup2(devnull, STDERR_FILENO);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    pid_ = pid;
    // Wait (bounded) until it answers.
    for (int i = 0; i < 100; ++i) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {  // exited: port taken?
        pid_ = -1;
        return false;
      }
      timeval tv{0, 200'000};
      context_ptr c(redisConnectWithTimeout("127.0.0.1", port_, tv));
      if (c && !c->err) {
        if (!password_.empty()) {
          void* r = user_.empty() ? redisCommand(c.get(), "AUTH %s", password_.c_str())
                                  : redisCommand(c.get(), "AUTH %s %s", user_.c_str(), password_.c_str());
          if (r) freeReplyObject(r);
        }
        // Up, and ours: another test's server could have taken the port between free_port() and bind.
        auto* r = static_cast<redisReply*>(redisCommand(c.get(), "INFO server"));
        if (r) {
          bool ours =
              r->type == REDIS_REPLY_STRING &&
              std::string(r->str, r->len).find("process_id:" + std::to_string(pid_) + "\r\n") != std::string::npos;
          bool noauth = r->type == REDIS_REPLY_ERROR;  // requirepass set and no password yet: it is up
          freeReplyObject(r);
          if (ours || noauth) return true;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    stop(SIGKILL);
    return false;
  }

  void stop(int sig) {
    if (pid_ <= 0) return;
    ::kill(pid_, sig);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

  std::vector<std::string> extra_;
  std::filesystem::path dir_;
  std::string config_file_;
  int port_ = 0;
  pid_t pid_ = -1;
  std::string user_;
  std::string password_;
  context_ptr ctx_;
};

}  // namespace sluice::testing
