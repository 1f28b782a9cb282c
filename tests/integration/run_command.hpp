// SPDX-License-Identifier: Apache-2.0
// tests/integration/run_command.hpp — runs a program to its end for a test fixture (etcdctl,
// openssl, redis-cli): its exit status and its output, stdout and stderr together.
//
//   command_result r = run_command({"/usr/bin/redis-cli", "--cluster", "create", ...});
//   if (r.exit_code != 0) throw std::runtime_error(r.output);
//
// Thread-safe.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <stdexcept>
#include <string>
#include <vector>

extern char** environ;

namespace sluice::testing {

struct command_result {
  int exit_code = -1;  ///< The exit status; -1 when killed by a signal.
  std::string output;  ///< stdout and stderr together.
};

/// Runs `argv` (argv[0] a path) to its end with `env` added to the environment, and with `input`
/// on its stdin.
inline command_result run_command(const std::vector<std::string>& argv, const std::vector<std::string>& env = {},
                                  const std::string& input = {}) {
  int out[2];
  int in[2];
  if (::pipe(out) != 0 || ::pipe(in) != 0) throw std::runtime_error("pipe failed");
  std::vector<std::string> envs;
  for (char** e = environ; *e != nullptr; ++e) envs.emplace_back(*e);
  envs.insert(envs.end(), env.begin(), env.end());
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<char*> envp;
  for (auto& e : envs) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::dup2(in[0], STDIN_FILENO);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(out[1], STDERR_FILENO);
    ::close(in[0]);
    ::close(in[1]);
    ::close(out[0]);
    ::close(out[1]);
    ::execve(args[0], args.data(), envp.data());
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  // All of the input before any output: etcdctl reads its stdin whole before it writes. A child
  // that reads none of it must not kill the test with SIGPIPE.
  ::signal(SIGPIPE, SIG_IGN);
  for (std::size_t done = 0; done < input.size();) {
    const ssize_t n = ::write(in[1], input.data() + done, input.size() - done);
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  ::close(in[1]);
  command_result r;
  char buf[4096];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) r.output.append(buf, static_cast<std::size_t>(n));
  ::close(out[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace sluice::testing
