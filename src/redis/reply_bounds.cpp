// SPDX-License-Identifier: Apache-2.0
// Its reply bounds (command.hpp): hiredis's reader makes each value through functions of ours that
// count the values and bytes of the reply being read, and refuse it past a bound or when no command
// waits for it.
#include <hiredis/hiredis.h>

#include <string>

#include "redis/command.hpp"

namespace sluice::detail {

namespace {

// hiredis's own reply functions, which the bounded ones call within the bounds. Set once, while the
// first bound_replies() makes those (before any reader can call them).
const redisReplyObjectFunctions* hiredis_functions = nullptr;

// Counts a value of the reply `task` is part of (its first value starts the count and takes a
// command waiting), with the elements it promises and the bytes it holds; false past a bound or
// with no command waiting, the refusal noted.
bool within_budget(const redisReadTask* task, std::size_t elements, std::size_t bytes) noexcept {
  auto& b = *static_cast<reply_budget*>(task->privdata);
  if (task->parent == nullptr) {
    // A new reply: it answers the oldest command waiting, if any.
    if (b.awaited == 0) {
      b.refused = reply_budget::refusal::unsolicited;
      return false;
    }
    --b.awaited;
    b.values = 1;  // an element was counted when its array was read
    b.string_bytes = 0;
  }
  b.values += elements;
  b.string_bytes += bytes;
  if (b.values > max_reply_values) b.refused = reply_budget::refusal::values;
  if (b.string_bytes > max_reply_bytes) b.refused = reply_budget::refusal::string_bytes;
  return b.values <= max_reply_values && b.string_bytes <= max_reply_bytes;
}

void* create_string(const redisReadTask* task, char* str, std::size_t len) {
  return within_budget(task, 0, len) ? hiredis_functions->createString(task, str, len) : nullptr;
}

void* create_array(const redisReadTask* task, int elements) {
  if (elements > max_reply_array) {
    auto& b = *static_cast<reply_budget*>(task->privdata);
    b.refused = reply_budget::refusal::array;
    b.refused_array = elements;
    return nullptr;
  }
  const std::size_t promised = elements > 0 ? static_cast<std::size_t>(elements) : 0;
  return within_budget(task, promised, 0) ? hiredis_functions->createArray(task, elements) : nullptr;
}

void* create_integer(const redisReadTask* task, long long value) {
  return within_budget(task, 0, 0) ? hiredis_functions->createInteger(task, value) : nullptr;
}

void* create_nil(const redisReadTask* task) {
  return within_budget(task, 0, 0) ? hiredis_functions->createNil(task) : nullptr;
}

}  // namespace

void bound_replies(redisReader& reader, reply_budget& budget) noexcept {
  // Made from the first reader's (every reader starts with hiredis's defaults), never changed after.
  static redisReplyObjectFunctions bounded = [&] {
    static const redisReplyObjectFunctions hiredis_own = *reader.fn;
    hiredis_functions = &hiredis_own;
    return redisReplyObjectFunctions{&create_string, &create_array, &create_integer, &create_nil,
                                     hiredis_own.freeObject};
  }();
  reader.fn = &bounded;
  reader.privdata = &budget;  // hiredis gives it to each value's task
}

std::string why_refused(const reply_budget& budget) {
  switch (budget.refused) {
    case reply_budget::refusal::none: return {};
    case reply_budget::refusal::array:
      return "a reply held an array of " + std::to_string(budget.refused_array) + " elements, more than " +
             std::to_string(max_reply_array);
    case reply_budget::refusal::values: return "a reply held more than " + std::to_string(max_reply_values) + " values";
    case reply_budget::refusal::string_bytes:
      return "a reply's strings held more than " + std::to_string(max_reply_bytes) + " bytes";
    case reply_budget::refusal::unsolicited: return "a reply came with no command waiting";
  }
  return {};
}

std::string overlong_reply(const redisReader& reader) {
  const std::size_t held = reader.len - reader.pos;  // what the reply being read holds so far
  if (held <= max_reply_line) return {};
  // A line that has ended but was not taken is a string's length, with the string itself still
  // coming. Else the line itself is still growing. The longest length line is 22 bytes.
  const std::string_view start(reader.buf + reader.pos, 24);
  if (start.find("\r\n") == std::string_view::npos) {
    return "a reply's line ran past " + std::to_string(max_reply_line) + " bytes";
  }
  if (held > max_reply_bytes) {
    return "a reply held " + std::to_string(held) + " bytes before it was whole, more than " +
           std::to_string(max_reply_bytes);
  }
  return {};
}

}  // namespace sluice::detail
