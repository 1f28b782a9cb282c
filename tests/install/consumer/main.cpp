// SPDX-License-Identifier: Apache-2.0
#include <sluice/keyed.hpp>
#include <sluice/token_bucket.hpp>

#include <cstdio>

int main() {
  auto bucket = sluice::token_bucket::create({.rate = sluice::per_second(5), .burst = 2});
  if (!bucket) return 1;
  const sluice::time_point now{std::chrono::seconds(1)};
  int admitted = 0;
  for (int i = 0; i < 3; ++i) admitted += bucket->try_acquire(now).value().allowed;
  auto users = sluice::keyed_limiter::create({.policy = sluice::sliding_window_policy(1, std::chrono::seconds(1))});
  if (!users) return 1;
  admitted += (*users)->try_acquire("user:1", now).value().allowed;
  std::printf("admitted %d\n", admitted);
  return admitted == 3 ? 0 : 1;
}
