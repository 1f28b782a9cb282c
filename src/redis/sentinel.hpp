// SPDX-License-Identifier: Apache-2.0
// src/redis/sentinel.hpp — a Sentinel switch followed: where the master the sentinels watch is, and
// when it moves.
//
// The sentinels are asked in turn, `SENTINEL get-master-addr-by-name NAME`, until one names the
// master. The first that answers is then subscribed to for `+switch-master`, so a failover is
// followed as the sentinels announce it. ask() asks again: the engine calls it when the master's
// connection is lost or refuses its ROLE, or when the master answers READONLY or LOADING. One round
// runs at a time; a round in which no sentinel names the master is tried again after
// breaker_probe_interval, and so is a lost subscription. A sentinel named by a host name is asked,
// and subscribed to, once the name resolves (passed over when it does not). What a sentinel says is only where to
// connect: the master's own connection confirms it with ROLE (connection.hpp) before anything is
// sent there, so a sentinel naming a replica, a closed port or itself never gets a write.
//
//   auto w = std::make_shared<sentinel_watch>(strand, sentinels, options, tls,
//                                             [](const endpoint& master) { ... });
//   w->start();  // on the strand, as every call
//
// Not thread-safe: every call, and the callback, on the strand. stop() before the last reference
// goes.
#pragma once

#include <boost/asio/steady_timer.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/log_throttle.hpp"
#include "redis/connection.hpp"

namespace sluice::detail {

/// A sentinel's answer to get-master-addr-by-name: the master's endpoint; nullopt with `why` set
/// when it names none (it does not know the name, is no sentinel, or said something unreadable).
std::optional<endpoint> read_master_address(const redisReply& reply, std::string& why);

/// A +switch-master message's payload, "NAME OLD-IP OLD-PORT NEW-IP NEW-PORT": the new master when
/// NAME is `master_name`.
std::optional<endpoint> read_switch_master(std::string_view payload, std::string_view master_name);

class sentinel_watch : public std::enable_shared_from_this<sentinel_watch> {
 public:
  using master_fn = std::function<void(const endpoint& master)>;

  sentinel_watch(const strand_type& strand, std::vector<endpoint> sentinels, const redis_options& o,
                 std::shared_ptr<const tls_settings> tls, master_fn on_master);

  void start() { ask(); }
  /// Asks the sentinels where the master is; joins the round under way, if any.
  void ask();
  /// Closes every connection; no more callbacks.
  void stop();

 private:
  struct ask_box;

  void ask_from(std::size_t i);
  void send_query(std::size_t i);
  void ask_next(std::size_t i);
  void on_query_opened(std::size_t i);
  void on_query_lost(std::size_t i, const std::string& why);
  static void on_answer(redisReply* reply, void* privdata);
  void answered(std::size_t i, std::uint64_t round, const redisReply* reply);
  void round_failed();
  void subscribe(std::size_t i);
  void on_message(const redisReply& message);
  void ask_later();

  strand_type strand_;
  const std::vector<endpoint> sentinels_;
  const redis_options options_;
  const std::shared_ptr<const tls_settings> tls_;
  const master_fn on_master_;
  asio::steady_timer retry_timer_;
  log_throttle log_;

  std::vector<std::shared_ptr<connection>> queries_;  // one per sentinel, connected when asked
  std::vector<std::string> why_not_;                  // this round: why each sentinel named no master
  std::shared_ptr<connection> subscriber_;            // to +switch-master, on one sentinel
  std::uint64_t round_ = 0;                           // a late answer to an older round is dropped
  static constexpr std::size_t no_sentinel = static_cast<std::size_t>(-1);
  std::size_t resolving_ = no_sentinel;  // this round's sentinel whose host name is being resolved
  bool asking_ = false;
  bool ask_again_ = false;  // asked for during a round: one more when it ends
  bool retry_armed_ = false;
  bool stopped_ = false;
};

}  // namespace sluice::detail
