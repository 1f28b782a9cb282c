// SPDX-License-Identifier: Apache-2.0
// src/redis/algorithm_scripts.hpp — the Lua body of each algorithm, from which scripts.cpp makes
// the scripts (single-layer, dual-layer, batch, all-or-nothing, leases). Included by scripts.cpp only.
#pragma once

#include <string_view>

namespace sluice::detail {

// Each algorithm is a body over (key, cost, its three parameters, commit) ending in
//   return allowed (0/1), remaining, retry µs (-1: never), reset µs      (whole µs, rounded up)
// With commit false it only looks (trimming expired entries changes no decision); with commit true
// it records an admitted cost. The values match the in-process states (gcra.hpp, window_states.hpp):
// remaining and reset after admission when allowed, of the current state when refused.
// The dual-layer script wraps each body in a function; a single-layer script runs its body inline
// (no closure per call: measurably cheaper), each `return a, b, c, d` becoming `return {a, b, c, d}`.
// Bodies therefore keep every `return` on one line of its own.
struct algorithm_lua {
  std::string_view name;
  std::string_view params;  // the names of p1, p2, p3
  std::string_view body;
};

// GCRA, in integer ns as in process (gcra.hpp), so Redis and the in-process bucket agree exactly.
// The key holds the theoretical arrival time as five little-endian doubles (struct.pack '<ddddd':
// no text to format or parse): µs since the epoch, the ns within that µs, the interval and the
// tolerance it was written with, and until when (µs, in `now`'s time) its TTL is known to last.
// Lua numbers are doubles: a TAT in ns since the epoch (~2^61) would step in hundreds of ns, so all
// arithmetic is on the debt TAT − now, an integer number of ns far below 2^53 (exact) for any debt
// under ~104 days. The key must live until the bucket is full again (TAT); setting its TTL on every
// write costs Redis as much as the rest of the script, so a write that moves the TTL sets it to
// twice the debt, and later writes within that keep it: a key outlives its refill by at most as long
// again, and a busy key's TTL is set about once per burst. A check's write that keeps the TTL
// overwrites the value in place (SETRANGE 0 of a value as long: the TTL stays, and Redis does less
// than for a SET with KEEPTTL); the key exists, as its value was just read.
// p1 = interval ns (0: infinite rate; else >= 1000, see redis_backend.hpp), p2 = tolerance ns
// (burst × interval), p3 = burst. An unreadable value counts as a full bucket. Read under another
// interval or tolerance (a rule's limits changed), the tokens the bucket holds carry over, capped by
// the new burst, as in gcra_state::retune and x/time/rate's SetLimit/SetBurst, and the value is
// written anew at once (refused or not), so that the old rate refills nothing after the first check
// that sees it.
inline constexpr algorithm_lua token_bucket_lua{"token_bucket", "interval, tolerance, burst", R"lua(
  if interval == 0 then
    return 1, burst, 0, 0
  end
  if burst == 0 then
    return 0, 0, -1, 0
  end
  local debt, expires = 0, 0
  local v = redis.call('GET', key)
  if v and #v == 40 then
    local us, ns, was_interval, was_tolerance, was_expires = struct.unpack('<ddddd', v)
    local d = (us - now) * 1000 + ns
    if d > 0 and d < 1e300 and was_interval > 0 and was_tolerance < 1e300 then
      debt, expires = d, was_expires
      if was_interval ~= interval or was_tolerance ~= tolerance then
        local available = (was_tolerance - debt) * interval / was_interval
        if available >= 0 then available = math.floor(available) else available = -math.floor(-available) end
        debt = tolerance - math.min(available, tolerance)
        if debt > 0 then
          local ns, ttl = debt % 1000, math.ceil(debt / 500000)
          expires = now + ttl * 1000
          redis.call('SET', key, struct.pack('<ddddd', now + (debt - ns) / 1000, ns, interval, tolerance, expires), 'PX', ttl)
        else
          redis.call('DEL', key)
          expires = 0  -- no key, no TTL to keep: the next write sets one
        end
      end
    end
  end
  local new_debt = debt + cost * interval
  if new_debt <= tolerance then
    if commit then
      local ns = new_debt % 1000
      local tat = now + (new_debt - ns) / 1000
      if tat < expires then
        redis.call('SETRANGE', key, '0', struct.pack('<ddddd', tat, ns, interval, tolerance, expires))
      else
        local ttl = math.max(1, math.ceil(new_debt / 500000))
        redis.call('SET', key, struct.pack('<ddddd', tat, ns, interval, tolerance, now + ttl * 1000), 'PX', ttl)
      end
    end
    return 1, math.floor((tolerance - new_debt) / interval), 0, math.ceil(new_debt / 1000)
  end
  return 0, math.max(0, math.floor((tolerance - debt) / interval)), math.ceil((new_debt - tolerance) / 1000), math.ceil(debt / 1000)
)lua"};

// Sliding window log on a ZSET with one entry per admission, whatever its cost (as in process,
// window_states.hpp). The score is the running total of units through the entry; the member packs
// four little-endian doubles (struct.pack '<dddd', far cheaper to read than text): time (µs), start
// (total − cost, which also makes members unique), and the oldest live entry's time and start as
// they stood when this one was added. Times ascend with the scores, so expired entries are a
// prefix; the newest entry alone tells whether any has expired since it was added, so a check
// reads one entry unless some have (each expired entry is read once, then removed by rank). Live
// units = newest total − oldest live start; the unit a refused check waits for is found by score.
// O(log n) a call and O(1) in the cost. Admissions in one µs share an entry; time never goes back
// (`at` is now, or the newest entry's time if later). Totals restart when the key empties and are
// rebased past 2^50, so they stay exact in doubles. The key expires W after its newest entry.
inline constexpr algorithm_lua sliding_window_log_lua{"sliding_window_log", "limit, window, _", R"lua(
  local at, last_time, last_total, base = now, nil, 0, 0
  local oldest_time, oldest_start
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if newest[1] then
    if #newest[1] == 32 then
      last_time, _, oldest_time, oldest_start = struct.unpack('<dddd', newest[1])
      last_total = tonumber(newest[2])
      if at < last_time then at = last_time end
    else
      redis.call('DEL', key)
    end
  end
  local cutoff = at - window
  if last_time and last_time <= cutoff then
    redis.call('DEL', key)
    last_time, last_total = nil, 0
  elseif last_time and oldest_time <= cutoff then
    local expired, step = 0, 1
    oldest_time = nil
    while not oldest_time do
      local batch = redis.call('ZRANGE', key, expired, expired + step - 1)
      for i = 1, #batch do
        if #batch[i] == 32 then
          local t, st = struct.unpack('<dd', batch[i])
          if t > cutoff then
            oldest_time, oldest_start = t, st
            break
          end
        end
        expired = expired + 1
      end
      step = 16
    end
    if expired > 0 then redis.call('ZREMRANGEBYRANK', key, 0, expired - 1) end
  end
  if last_time then base = oldest_start end
  if base > 1125899906842624 then
    local all = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
    redis.call('DEL', key)
    for i = 1, #all, 2 do
      local t, st, ot, os = struct.unpack('<dddd', all[i])
      redis.call('ZADD', key, tonumber(all[i + 1]) - base, struct.pack('<dddd', t, st - base, ot, math.max(0, os - base)))
    end
    last_total, oldest_start, base = last_total - base, 0, 0
  end
  local live = last_total - base
  if cost <= limit - live then
    if commit then
      if live > 0 and last_time == at then
        redis.call('ZINCRBY', key, cost, newest[1])
      elseif live > 0 then
        redis.call('ZADD', key, last_total + cost, struct.pack('<dddd', at, last_total, oldest_time, oldest_start))
      else
        redis.call('ZADD', key, cost, struct.pack('<dddd', at, 0, at, 0))
      end
      redis.call('PEXPIRE', key, math.ceil(window / 1000))
    end
    return 1, limit - live - cost, 0, window
  end
  local holder = redis.call('ZRANGEBYSCORE', key, base + cost - (limit - live), '+inf', 'LIMIT', 0, 1)
  local t = struct.unpack('<d', holder[1])
  return 0, math.max(0, limit - live), math.ceil(t + window - at), math.ceil(last_time + window - at)
)lua"};

// Sliding window counter: three doubles (index, current, previous; struct.pack '<ddd') for windows
// aligned to multiples of W; estimate = previous * (W - elapsed) / W + current. Expires at the end
// of the next window: set when a window's first write makes the value, kept by the rest (which
// overwrite the value in place, as the token bucket does).
inline constexpr algorithm_lua sliding_window_counter_lua{"sliding_window_counter", "limit, window, _", R"lua(
  local index = math.floor(now / window)
  local elapsed = now - index * window
  local to_end = window - elapsed
  local cur, prev, same = 0, 0, false
  local v = redis.call('GET', key)
  if v and #v == 24 then
    local i, c, p = struct.unpack('<ddd', v)
    if i >= index then cur, prev, same = c, p, i == index
    elseif i == index - 1 then prev = c end
  end
  local weighted = prev * (window - elapsed) / window
  if weighted + cur + cost <= limit + 1e-9 then
    if commit then
      local value = struct.pack('<ddd', index, cur + cost, prev)
      if same then
        redis.call('SETRANGE', key, '0', value)
      else
        redis.call('SET', key, value, 'PX', math.ceil((to_end + window) / 1000))
      end
    end
    return 1, math.max(0, math.floor(limit - weighted - cur - cost + 1e-9)), 0, to_end + window
  end
  local retry
  if cur + cost <= limit then
    retry = window - (limit - cur - cost) * window / prev - elapsed
  else
    retry = to_end + math.max(0, window - (limit - cost) * window / cur)
  end
  if retry < 1 then retry = 1 end
  local reset = 0
  if cur > 0 then reset = to_end + window elseif prev > 0 then reset = to_end end
  return 0, math.max(0, math.floor(limit - weighted - cur + 1e-9)), math.ceil(retry), reset
)lua"};

// Fixed window: two doubles (index, count; struct.pack '<dd') expiring at the end of its aligned
// window: set by the window's first write, kept by the rest (which overwrite the value in place, as
// the token bucket does). `calendar` (window_states.hpp's fixed_period): 0 windows aligned to the
// epoch, 1 UTC days, 2 ISO weeks (from a Monday: 4 days after the epoch's Thursday), 3 UTC months,
// whose index counts months since 1970 and whose end is the next month's first day (from the date,
// by the days-from-civil arithmetic of the proleptic Gregorian calendar).
inline constexpr algorithm_lua fixed_window_lua{"fixed_window", "limit, window, calendar", R"lua(
  local index, to_end
  if calendar < 3 then
    local shifted = now
    if calendar == 2 then shifted = now - 345600000000 end
    index = math.floor(shifted / window)
    to_end = window - (shifted - index * window)
  else
    local z = math.floor(now / 86400000000) + 719468
    local era = math.floor(z / 146097)
    local doe = z - era * 146097
    local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
    local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
    local mp = math.floor((5 * doy + 2) / 153)
    local y, m = yoe + era * 400, mp + 3
    if mp >= 10 then y, m = y + 1, mp - 9 end
    index = (y - 1970) * 12 + m - 1
    if m == 12 then y, m = y + 1, 1 else m = m + 1 end
    if m <= 2 then y = y - 1 end
    era = math.floor(y / 400)
    yoe = y - era * 400
    local next_mp = m - 3
    if m <= 2 then next_mp = m + 9 end
    doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + math.floor((153 * next_mp + 2) / 5)
    to_end = (era * 146097 + doe - 719468) * 86400000000 - now
  end
  local used, same = 0, false
  local v = redis.call('GET', key)
  if v and #v == 16 then
    local i, c = struct.unpack('<dd', v)
    if i >= index then used, same = c, i == index end
  end
  if used + cost <= limit then
    if commit then
      local value = struct.pack('<dd', index, used + cost)
      if same then
        redis.call('SETRANGE', key, '0', value)
      else
        redis.call('SET', key, value, 'PX', math.ceil(to_end / 1000))
      end
    end
    return 1, limit - used - cost, 0, to_end
  end
  local reset = 0
  if used > 0 then reset = to_end end
  return 0, math.max(0, limit - used), to_end, reset
)lua"};

}  // namespace sluice::detail
