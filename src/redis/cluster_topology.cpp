// SPDX-License-Identifier: Apache-2.0
#include "redis/cluster_topology.hpp"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <charconv>

#include "redis/slot.hpp"

namespace sluice::detail {
namespace {

std::string_view text(const redisReply& r) {
  if (r.type != REDIS_REPLY_STRING && r.type != REDIS_REPLY_STATUS) return {};
  return {r.str, r.len};
}

// An integer reply, or a decimal string one (Redis 7.0.x sends some numbers as strings).
std::optional<long long> number(const redisReply& r) {
  if (r.type == REDIS_REPLY_INTEGER) return r.integer;
  const std::string_view s = text(r);
  long long v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

bool valid_slot(long long v) { return v >= 0 && v < slot_count; }

// The value of `name` in a flat [name, value, name, value, ...] array; nullptr when absent.
const redisReply* field(const redisReply& map, std::string_view name) {
  if (map.type != REDIS_REPLY_ARRAY) return nullptr;
  for (std::size_t i = 0; i + 1 < map.elements; i += 2) {
    if (text(*map.element[i]) == name) return map.element[i + 1];
  }
  return nullptr;
}

std::string_view text_field(const redisReply& map, std::string_view name) {
  const redisReply* v = field(map, name);
  return v ? text(*v) : std::string_view();
}

error bad(std::string what) { return {errc::backend_protocol, "cluster topology: " + std::move(what)}; }

// Sorted, checked for overlap.
result<std::vector<slot_owner>> finish(std::vector<slot_owner> owners) {
  std::sort(owners.begin(), owners.end(), [](const slot_owner& a, const slot_owner& b) { return a.first < b.first; });
  for (std::size_t i = 1; i < owners.size(); ++i) {
    if (owners[i].first <= owners[i - 1].last)
      return bad("slot ranges overlap at slot " + std::to_string(owners[i].first));
  }
  return owners;
}

// A CLUSTER SHARDS node's host: its endpoint; an empty endpoint is the replying node's ("the one you
// asked"), "?" an unknown one (then its ip, if any).
std::optional<std::string> host_of_node(const redisReply& n, std::string_view replying_host, bool tls,
                                        long long* port) {
  const redisReply* p = tls ? field(n, "tls-port") : nullptr;
  if (p == nullptr) p = field(n, "port");
  const std::optional<long long> pv = p ? number(*p) : std::nullopt;
  if (!pv || *pv < 1 || *pv > 65535) return std::nullopt;
  *port = *pv;
  std::string_view host = text_field(n, "endpoint");
  if (host.empty() && field(n, "endpoint") != nullptr) host = replying_host;
  if (host.empty() || host == "?") host = text_field(n, "ip");
  if (host.empty() || host == "?" || host.size() > 255) return std::nullopt;
  return std::string(host);
}

}  // namespace

std::string host_of(std::string_view address) {
  std::string_view host = address.substr(0, address.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return std::string(host);
}

std::string node_address(std::string_view host, long long port, std::string_view replying_host) {
  if (host.empty()) host = replying_host;
  std::string a;
  if (host.find(':') != std::string_view::npos) {
    a += '[';
    a += host;
    a += ']';
  } else {
    a += host;
  }
  a += ':';
  a += std::to_string(port);
  return a;
}

result<std::vector<slot_owner>> parse_cluster_shards(const redisReply& r, std::string_view replying_host, bool tls) {
  if (r.type != REDIS_REPLY_ARRAY) return bad("CLUSTER SHARDS did not answer an array");
  std::vector<slot_owner> owners;
  for (std::size_t s = 0; s < r.elements; ++s) {
    const redisReply& shard = *r.element[s];
    const redisReply* slots = field(shard, "slots");
    const redisReply* nodes = field(shard, "nodes");
    if (slots == nullptr || nodes == nullptr || slots->type != REDIS_REPLY_ARRAY || nodes->type != REDIS_REPLY_ARRAY ||
        slots->elements % 2 != 0) {
      return bad("a shard without well-formed slots and nodes");
    }
    if (slots->elements == 0) continue;
    // The shard's master: after a failover a failed old master may still be listed as one (Redis
    // 7.2), so one whose health is online comes first, then any not failed.
    std::optional<std::string> master;
    int best = 0;  // 2: online, 1: not failed
    for (std::size_t n = 0; n < nodes->elements; ++n) {
      const redisReply& node = *nodes->element[n];
      if (text_field(node, "role") != "master") continue;
      const std::string_view health = text_field(node, "health");
      const int rank = health == "online" ? 2 : health == "failed" ? 0 : 1;
      if (rank <= best && master) continue;
      if (rank == 0) continue;
      long long port = 0;
      auto host = host_of_node(node, replying_host, tls, &port);
      if (!host) return bad("a master without a usable address and port");
      master = node_address(*host, port, replying_host);
      best = rank;
    }
    if (!master) continue;  // no master now (a failover under way): its slots stay unknown
    for (std::size_t i = 0; i < slots->elements; i += 2) {
      const auto first = number(*slots->element[i]);
      const auto last = number(*slots->element[i + 1]);
      if (!first || !last || !valid_slot(*first) || !valid_slot(*last) || *first > *last) {
        return bad("a slot range out of 0..16383");
      }
      if (owners.size() >= slot_count) return bad("more slot ranges than slots");
      owners.push_back({static_cast<std::uint16_t>(*first), static_cast<std::uint16_t>(*last), *master});
    }
  }
  return finish(std::move(owners));
}

result<std::vector<slot_owner>> parse_cluster_slots(const redisReply& r, std::string_view replying_host) {
  if (r.type != REDIS_REPLY_ARRAY) return bad("CLUSTER SLOTS did not answer an array");
  std::vector<slot_owner> owners;
  for (std::size_t i = 0; i < r.elements; ++i) {
    const redisReply& range = *r.element[i];
    if (range.type != REDIS_REPLY_ARRAY || range.elements < 3) return bad("a slot range of the wrong shape");
    const auto first = number(*range.element[0]);
    const auto last = number(*range.element[1]);
    if (!first || !last || !valid_slot(*first) || !valid_slot(*last) || *first > *last) {
      return bad("a slot range out of 0..16383");
    }
    const redisReply& master = *range.element[2];
    if (master.type != REDIS_REPLY_ARRAY || master.elements < 2) return bad("a slot range without its master");
    const auto port = number(*master.element[1]);
    const std::string_view host = master.element[0]->type == REDIS_REPLY_NIL ? "" : text(*master.element[0]);
    if (!port || *port < 1 || *port > 65535 || host.size() > 255) return bad("a master without a usable address");
    if (host == "?") continue;  // an unknown endpoint: its slots stay unknown
    if (owners.size() >= slot_count) return bad("more slot ranges than slots");
    owners.push_back({static_cast<std::uint16_t>(*first), static_cast<std::uint16_t>(*last),
                      node_address(host, *port, replying_host)});
  }
  return finish(std::move(owners));
}

reply_error classify_error(std::string_view m) noexcept {
  auto word = [m](std::string_view w) { return m.starts_with(w) && (m.size() == w.size() || m[w.size()] == ' '); };
  if (word("MOVED")) return reply_error::moved;
  if (word("ASK")) return reply_error::ask;
  if (word("TRYAGAIN")) return reply_error::tryagain;
  if (word("CLUSTERDOWN")) return reply_error::clusterdown;
  if (word("READONLY")) return reply_error::readonly;
  if (word("LOADING")) return reply_error::loading;
  if (word("NOSCRIPT")) return reply_error::noscript;
  if (word("OOM")) return reply_error::oom;
  return reply_error::other;
}

std::optional<redirection> parse_redirection(std::string_view m, std::string_view replying_host) {
  // "MOVED <slot> <host>:<port>" or "ASK <slot> <host>:<port>"; the host may hold ':' (IPv6).
  const auto sp1 = m.find(' ');
  if (sp1 == std::string_view::npos) return std::nullopt;
  const auto sp2 = m.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos) return std::nullopt;
  const std::string_view slot_text = m.substr(sp1 + 1, sp2 - sp1 - 1);
  std::string_view where = m.substr(sp2 + 1);
  const auto colon = where.rfind(':');
  if (colon == std::string_view::npos) return std::nullopt;
  std::string_view host = where.substr(0, colon);
  const std::string_view port_text = where.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  int slot = -1;
  int port = 0;
  auto [e1, ec1] = std::from_chars(slot_text.data(), slot_text.data() + slot_text.size(), slot);
  auto [e2, ec2] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec1 != std::errc() || e1 != slot_text.data() + slot_text.size() || !valid_slot(slot)) return std::nullopt;
  if (ec2 != std::errc() || e2 != port_text.data() + port_text.size() || port < 1 || port > 65535) return std::nullopt;
  if (host == "?" || host.size() > 255 || host.find_first_of(" \r\n") != std::string_view::npos) return std::nullopt;
  return redirection{static_cast<std::uint16_t>(slot), node_address(host, port, replying_host)};
}

}  // namespace sluice::detail
