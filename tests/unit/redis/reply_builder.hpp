// SPDX-License-Identifier: Apache-2.0
// tests/unit/redis/reply_builder.hpp — redisReply trees built by hand, as hiredis's reader hands
// them over, for tests of what reads replies (command.hpp, cluster_topology.hpp) without a server.
//
//   replies r;
//   const redisReply* reply = r.array({r.integer(1), r.string("OK")});
//
// Not thread-safe.
#pragma once

#include <hiredis/hiredis.h>

#include <deque>
#include <initializer_list>
#include <string>
#include <vector>

namespace sluice::detail {

// Replies as hiredis's reader makes them; every node lives as long as the builder.
class replies {
 public:
  redisReply* integer(long long v) {
    redisReply& r = node(REDIS_REPLY_INTEGER);
    r.integer = v;
    return &r;
  }
  redisReply* string(std::string s, int type = REDIS_REPLY_STRING) {
    redisReply& r = node(type);
    std::string& held = strings_.emplace_back(std::move(s));
    r.str = held.data();
    r.len = held.size();
    return &r;
  }
  redisReply* nil() { return &node(REDIS_REPLY_NIL); }
  redisReply* array(std::vector<redisReply*> elements) {
    redisReply& r = node(REDIS_REPLY_ARRAY);
    std::vector<redisReply*>& held = arrays_.emplace_back(std::move(elements));
    r.elements = held.size();
    r.element = held.empty() ? nullptr : held.data();
    return &r;
  }
  redisReply* integers(std::initializer_list<long long> values) {
    std::vector<redisReply*> e;
    for (long long v : values) e.push_back(integer(v));
    return array(std::move(e));
  }

 private:
  redisReply& node(int type) {
    redisReply& r = nodes_.emplace_back();
    r.type = type;
    return r;
  }
  std::deque<redisReply> nodes_;
  std::deque<std::string> strings_;
  std::deque<std::vector<redisReply*>> arrays_;
};

}  // namespace sluice::detail
