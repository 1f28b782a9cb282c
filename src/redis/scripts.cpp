// SPDX-License-Identifier: Apache-2.0
#include "redis/scripts.hpp"

#include <boost/uuid/detail/sha1.hpp>
#include <cstdio>

#include "redis/algorithm_scripts.hpp"

namespace sluice::detail {
namespace {

// Shared by every script: `now` (µs, from TIME unless a test passes it) and the deadline.
// Numbers come as hex digits (scripts.hpp): Lua reads them with strtoul, several times cheaper
// than the strtod of decimal text, and a script reads six or more a call. strtoul is 64 bits wide
// on a 64-bit redis-server only; a 32-bit build would read every µs time as 2^32 - 1.
// The shebang declares a Redis 7 script that writes: Redis refuses it whole, before it runs, while
// over maxmemory (OOM), so no script grows memory past the limit. Scripts replicate their effects,
// so reading TIME before writing is allowed. A call that reaches Redis after its deadline (server
// time, µs; all f's for none) answers {-1, now} and records nothing: its caller gave up on it
// already. `now` is "-" (not a number) to read Redis's TIME.
// Every reply ends with `now`, from which the caller keeps its estimate of the server's clock.
// `deadline_arg` is where the call carries its deadline (the last ARGV, or the batch's ARGV[2]).
std::string time_and_deadline(std::string_view deadline_arg) {
  std::string p = R"lua(#!lua
local now = tonumber(ARGV[1], 16)
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
if now > tonumber()lua";
  p += deadline_arg;
  p += R"lua(, 16) then
  return {-1, now}
end
)lua";
  return p;
}

// What single-layer and dual-layer scripts start with: the above, and the cost.
std::string prelude() { return time_and_deadline("ARGV[#ARGV]") + "local cost = tonumber(ARGV[2], 16)\n"; }

// All or nothing: the user layer records only when the tenant layer would admit, and the tenant
// layer records only when the user layer did; a refusal by one layer consumes nothing of the other.
// (The tenant layer is evaluated twice on success; nothing changes between the two inside a script.)
// Each layer reports as it stands after the check, as in process (check_dual_layer): whether it
// would admit, and a layer that would have admitted but recorded nothing its unchanged state (+ cost).
// The caller combines the two (combine_layers).
constexpr std::string_view dual_lua = R"lua(
local function dual(tf, uf, tk, uk, cost, record, t1, t2, t3, u1, u2, u3)
  local ta, tr, tw, tz = tf(tk, cost, t1, t2, t3, false)
  if ta == 0 then
    local ua, ur, uw, uz = uf(uk, cost, u1, u2, u3, false)
    if ua == 1 then ur = ur + cost end
    return 0, tr, tw, tz, ua, ur, uw, uz
  end
  local ua, ur, uw, uz = uf(uk, cost, u1, u2, u3, record)
  if ua == 0 then
    return 1, tr + cost, tw, tz, 0, ur, uw, uz
  end
  if record then ta, tr, tw, tz = tf(tk, cost, t1, t2, t3, true) end
  return 1, tr, tw, tz, 1, ur, uw, uz
end
)lua";

// A check of cost 0 looks: one unit evaluated, nothing recorded; the caller reports what is left
// before that unit (looked()). Single-layer, dual-layer and batch scripts read it so.
constexpr std::string_view look_lua = "local record = cost > 0\nif not record then cost = 1 end\n";

constexpr std::string_view dual_main = R"lua(
local t1, t2, t3 = tonumber(ARGV[3], 16), tonumber(ARGV[4], 16), tonumber(ARGV[5], 16)
local u1, u2, u3 = tonumber(ARGV[6], 16), tonumber(ARGV[7], 16), tonumber(ARGV[8], 16)
local out = {dual(tf, uf, KEYS[1], KEYS[2], cost, record, t1, t2, t3, u1, u2, u3)}
out[9] = now
return out
)lua";

// The values t[1..n] as one string of little-endian doubles: the reply of a script deciding many
// checks. Redis turns each number of a reply table into an integer reply of its own; one string
// costs it (and the client reading it) less. The values are whole numbers (a double holds them
// exactly), read back as Redis would have cast them. One struct.pack call per 512 values (unpack
// puts them on Lua's stack, which holds a few thousand).
constexpr std::string_view packed_lua = R"lua(
local function packed(t, n)
  local parts = {}
  for i = 1, n, 512 do
    local j = math.min(n, i + 511)
    parts[#parts + 1] = struct.pack('<' .. string.rep('d', j - i + 1), unpack(t, i, j))
  end
  return table.concat(parts)
end
)lua";

// Single-layer checks all or nothing (backend::check_all): each is first only looked at; when
// every one would admit (and `record` is true), each is recorded, and its figures are as it stands
// after; otherwise none is, and one that would have admitted reports its unchanged state (+ cost).
// The n checks' keys are KEYS[k..], their algorithm indexes, costs and parameters (five per check)
// ARGV[a..]; their four values each go into out[o + 1..].
constexpr std::string_view group_lua = R"lua(
local fs = {token_bucket, sliding_window_log, sliding_window_counter, fixed_window}
local function group(k, a, n, record, out, o)
  local all = record
  for i = 0, n - 1 do
    local b, v = a + i * 5, o + i * 4
    out[v + 1], out[v + 2], out[v + 3], out[v + 4] = fs[tonumber(ARGV[b], 16) + 1](KEYS[k + i], tonumber(ARGV[b + 1], 16), tonumber(ARGV[b + 2], 16), tonumber(ARGV[b + 3], 16), tonumber(ARGV[b + 4], 16), false)
    if out[v + 1] == 0 then all = false end
  end
  for i = 0, n - 1 do
    local b, v = a + i * 5, o + i * 4
    if all then
      out[v + 1], out[v + 2], out[v + 3], out[v + 4] = fs[tonumber(ARGV[b], 16) + 1](KEYS[k + i], tonumber(ARGV[b + 1], 16), tonumber(ARGV[b + 2], 16), tonumber(ARGV[b + 3], 16), tonumber(ARGV[b + 4], 16), true)
    elseif out[v + 1] == 1 then
      out[v + 2] = out[v + 2] + tonumber(ARGV[b + 1], 16)
    end
  end
end
)lua";

// Many checks in one call, decided in order as if each came alone at the same µs: one TIME, one
// deadline for all. ARGV[1] = now, ARGV[2] = deadline, ARGV[3] = how many parameter sets follow,
// each its kind — an algorithm's index for one key; 4 + tenant index × 4 + user index for a
// dual-layer pair of keys — and its parameters (three per key); then per check its set (1-based)
// and cost, or 0 for a check_all's group followed by its number of checks, whether to record, and
// its checks' five each. A rule's parameters go once a call, however many of its checks are in it
// (but for a group's checks).
// KEYS hold the checks' keys in order. The reply is {values, now}: values packs (packed()) each
// check's values as its own script returns them, without `now`, one after another. On a cluster
// its keys share one slot (Redis refuses others with CROSSSLOT), as a dual-layer check's two do.
constexpr std::string_view batch_main = R"lua(
local sets, a = {}, 4
for s = 1, tonumber(ARGV[3], 16) do
  local kind = tonumber(ARGV[a], 16)
  if kind < 4 then
    sets[s] = {fs[kind + 1], false, tonumber(ARGV[a + 1], 16), tonumber(ARGV[a + 2], 16), tonumber(ARGV[a + 3], 16)}
    a = a + 4
  else
    sets[s] = {fs[math.floor((kind - 4) / 4) + 1], fs[(kind - 4) % 4 + 1],
               tonumber(ARGV[a + 1], 16), tonumber(ARGV[a + 2], 16), tonumber(ARGV[a + 3], 16),
               tonumber(ARGV[a + 4], 16), tonumber(ARGV[a + 5], 16), tonumber(ARGV[a + 6], 16)}
    a = a + 7
  end
end
local out, n, k, argc = {}, 0, 1, #ARGV
while a <= argc do
  local s = tonumber(ARGV[a], 16)
  if s == 0 then
    local count = tonumber(ARGV[a + 1], 16)
    group(k, a + 3, count, ARGV[a + 2] == '1', out, n)
    n, k, a = n + 4 * count, k + count, a + 3 + 5 * count
  else
    local set, cost = sets[s], tonumber(ARGV[a + 1], 16)
    local record = cost > 0
    if not record then cost = 1 end
    if not set[2] then
      out[n + 1], out[n + 2], out[n + 3], out[n + 4] = set[1](KEYS[k], cost, set[3], set[4], set[5], record)
      n, k = n + 4, k + 1
    else
      out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5], out[n + 6], out[n + 7], out[n + 8] =
        dual(set[1], set[2], KEYS[k], KEYS[k + 1], cost, record, set[3], set[4], set[5], set[6], set[7], set[8])
      n, k = n + 8, k + 2
    end
    a = a + 2
  end
end
return {packed(out, n), now}
)lua";

// One check_all's group in a call of its own: ARGV[1] = now, ARGV[2] = 1 to record, 0 to only look
// (the caller found a cost that no wait admits), then per check its algorithm's index, cost and
// three parameters, and last the deadline; KEYS[i] is check i's key. The reply is {values, now}:
// values packs (packed()) each check's four values. On a cluster its keys share one slot.
constexpr std::string_view all_main = R"lua(
local n = (#ARGV - 3) / 5
local out = {}
group(1, 3, n, ARGV[2] == '1', out, 0)
return {packed(out, 4 * n), now}
)lua";

// Takes a lease (lease.hpp): checks `cost` (0 for a refill ahead of need: then looks at one
// unit) and, when it admits, records up to `want` units (at least the cost; at most what fits) and
// replies {1, remaining, 0, reset µs, units, token, valid µs}: remaining after the lease less the
// check's own cost (what an exact check reports, plus the lease's units left), the units leased,
// what a give-back compares (a token bucket's value; a window's index, packed as its value holds
// it), and for how long the units may be used (a window: until it ends; a token bucket: until the
// last unit's slot ends, within 1 µs, rounded down). A refusal replies the algorithm's four values,
// then 0, '', 0. A token-bucket lease holds the bucket's timeline until `hold` ns from now when that
// is further than its units reach: unit j of n may be used until its slot ends, n - j intervals
// before the last one's, and a lease used evenly over its period never outruns them (extra slots
// before the units are spent without being used, up to the hold; what cannot fit is not taken).
constexpr std::string_view lease_lua = R"lua(
local leasable = {token_bucket, nil, sliding_window_counter, fixed_window}
local function lease(key, alg, cost, want, p1, p2, p3, hold)
  local f = leasable[alg + 1]
  local look = math.max(cost, 1)
  local a, r, w, z = f(key, look, p1, p2, p3, false)
  if a == 0 then
    return 0, r, w, z, 0, '', 0
  end
  local fit = look + r
  local n = math.min(want, fit)
  local extra = 0
  if alg == 0 and p1 > 0 then
    local debt = z * 1000 - look * p1
    extra = math.min(fit - n, math.max(0, math.floor((hold - n * p1 - debt) / p1)))
  end
  a, r, w, z = f(key, n + extra, p1, p2, p3, true)
  if alg == 0 then
    return 1, r + n - cost, 0, z, n, redis.call('GET', key) or '', z - 1
  end
  local index = math.floor(now / p2)
  return 1, r + n - cost, 0, z, n, struct.pack('<d', index), p2 - (now - index * p2)
end
)lua";

// A single-layer lease: KEYS[1]; ARGV[1] = now, cost, want, the algorithm's index, its three
// parameters, hold ns, deadline. The reply: lease()'s seven values, then now.
constexpr std::string_view lease_main = R"lua(
local out = {lease(KEYS[1], tonumber(ARGV[4], 16), cost, tonumber(ARGV[3], 16), tonumber(ARGV[5], 16), tonumber(ARGV[6], 16), tonumber(ARGV[7], 16), tonumber(ARGV[8], 16))}
out[8] = now
return out
)lua";

// A dual-layer check whose tenant layer is leased, all or nothing as dual(): KEYS = tenant, user;
// ARGV[1] = now, cost, want, the tenant's algorithm index, its three parameters, hold ns, the
// user's algorithm index, its three parameters, deadline. The user layer records only when the
// tenant layer admits, and the tenant's lease is taken only when the user layer admitted. The
// reply: the tenant's four values, the user's four, the lease's units, token and valid µs, now.
constexpr std::string_view lease_dual_main = R"lua(
local tk, uk, want, talg = KEYS[1], KEYS[2], tonumber(ARGV[3], 16), tonumber(ARGV[4], 16)
local t1, t2, t3, hold = tonumber(ARGV[5], 16), tonumber(ARGV[6], 16), tonumber(ARGV[7], 16), tonumber(ARGV[8], 16)
local uf = fs[tonumber(ARGV[9], 16) + 1]
local u1, u2, u3 = tonumber(ARGV[10], 16), tonumber(ARGV[11], 16), tonumber(ARGV[12], 16)
local ta, tr, tw, tz = leasable[talg + 1](tk, cost, t1, t2, t3, false)
if ta == 0 then
  local ua, ur, uw, uz = uf(uk, cost, u1, u2, u3, false)
  if ua == 1 then ur = ur + cost end
  return {0, tr, tw, tz, ua, ur, uw, uz, 0, '', 0, now}
end
local ua, ur, uw, uz = uf(uk, cost, u1, u2, u3, true)
if ua == 0 then
  return {1, tr + cost, tw, tz, 0, ur, uw, uz, 0, '', 0, now}
end
local a, r, w, z, n, token, valid = lease(tk, talg, cost, want, t1, t2, t3, hold)
return {a, r, w, z, 1, ur, uw, uz, n, token, valid, now}
)lua";

// Gives a lease's unused units back, when that is still exact: KEYS[1]; ARGV[1] = now, the
// algorithm's index, the lease's token, the units, a token bucket's interval ns, deadline. A window
// takes them off its count (the second double of either window's value) while it is still the
// lease's window; a token bucket moves its TAT back by their slots (x/time/rate's Cancel) while its
// value is still the one the lease wrote, i.e. nobody took a unit since — the units are then the
// last slots. Both keep the TTL, which covers the state before. Replies {units given back (0:
// none), now}.
constexpr std::string_view give_back_main = R"lua(
local key, alg, token, units = KEYS[1], tonumber(ARGV[2], 16), ARGV[3], tonumber(ARGV[4], 16)
local v = redis.call('GET', key)
if not v then return {0, now} end
if alg == 0 then
  if v ~= token or #v ~= 40 then return {0, now} end
  local us, ns, interval, tolerance, expires = struct.unpack('<ddddd', v)
  local debt = (us - now) * 1000 + ns - units * tonumber(ARGV[5], 16)
  if debt <= 0 then
    redis.call('DEL', key)
  else
    ns = debt % 1000
    redis.call('SET', key, struct.pack('<ddddd', now + (debt - ns) / 1000, ns, interval, tolerance, expires), 'KEEPTTL')
  end
  return {units, now}
end
if #v < 16 or string.sub(v, 1, 8) ~= token then return {0, now} end
local _, c = struct.unpack('<dd', v)
redis.call('SET', key, token .. struct.pack('<d', math.max(0, c - units)) .. string.sub(v, 17), 'KEEPTTL')
return {units, now}
)lua";

constexpr const algorithm_lua* algorithms[algorithm_count] = {&token_bucket_lua, &sliding_window_log_lua,
                                                              &sliding_window_counter_lua, &fixed_window_lua};

std::string as_function(const algorithm_lua& a) {
  std::string f = "local function ";
  f += a.name;
  f += "(key, cost, ";
  f += a.params;
  f += ", commit)";
  f += a.body;
  f += "end\n";
  return f;
}

// The body at top level: parameters from KEYS/ARGV, and each one-line `return a, b, c, d` turned
// into `return {a, b, c, d, now}`.
std::string single(const algorithm_lua& a) {
  std::string body = prelude();
  body += look_lua;
  body += "local key, commit = KEYS[1], record\nlocal ";
  body += a.params;
  body += " = tonumber(ARGV[3], 16), tonumber(ARGV[4], 16), tonumber(ARGV[5], 16)";
  std::string_view rest = a.body;
  while (!rest.empty()) {
    const std::size_t eol = rest.find('\n');
    std::string_view line = rest.substr(0, eol == std::string_view::npos ? rest.size() : eol + 1);
    rest.remove_prefix(line.size());
    const std::size_t at = line.find("return ");
    if (at != std::string_view::npos && line.find_first_not_of(' ') == at) {
      std::string_view values = line.substr(at + 7);
      while (!values.empty() && (values.back() == '\n' || values.back() == ' ')) values.remove_suffix(1);
      body.append(line.substr(0, at));
      body += "return {";
      body += values;
      body += ", now}\n";
    } else {
      body += line;
    }
  }
  return body;
}

// Only the two algorithms of the pair are defined: fewer closures per call.
std::string dual(const algorithm_lua& tenant, const algorithm_lua& user) {
  std::string body = prelude();
  body += as_function(tenant);
  if (&tenant != &user) body += as_function(user);
  body += dual_lua;
  body += look_lua;
  body += "local tf, uf = ";
  body += tenant.name;
  body += ", ";
  body += user.name;
  body += dual_main;
  return body;
}

std::string batch() {
  std::string body = time_and_deadline("ARGV[2]");
  for (const algorithm_lua* a : algorithms) body += as_function(*a);
  body += dual_lua;
  body += group_lua;
  body += packed_lua;
  body += batch_main;
  return body;
}

std::string all_or_nothing() {
  std::string body = time_and_deadline("ARGV[#ARGV]");
  for (const algorithm_lua* a : algorithms) body += as_function(*a);
  body += group_lua;
  body += packed_lua;
  body += all_main;
  return body;
}

std::string with_every_algorithm(std::string body) {
  for (const algorithm_lua* a : algorithms) body += as_function(*a);
  body += "local fs = {token_bucket, sliding_window_log, sliding_window_counter, fixed_window}\n";
  body += lease_lua;
  return body;
}

std::string lease_single() { return with_every_algorithm(prelude()) + std::string(lease_main); }

std::string lease_dual() { return with_every_algorithm(prelude()) + std::string(lease_dual_main); }

script make(std::string name, std::string body) {
  std::string sha = sha1_hex(body);
  return {std::move(name), std::move(body), std::move(sha)};
}

}  // namespace

std::string sha1_hex(std::string_view text) {
  boost::uuids::detail::sha1 h;
  h.process_bytes(text.data(), text.size());
  boost::uuids::detail::sha1::digest_type digest;
  h.get_digest(digest);
  char out[41];
  for (int i = 0; i < 5; ++i) std::snprintf(out + i * 8, 9, "%08x", digest[i]);
  return std::string(out, 40);
}

const std::array<script, script_count>& scripts() {
  static const std::array<script, script_count> all = [] {
    std::array<script, script_count> out;
    for (std::size_t a = 0; a < algorithm_count; ++a) {
      out[a] = make(std::string(algorithms[a]->name), single(*algorithms[a]));
      for (std::size_t b = 0; b < algorithm_count; ++b) {
        out[algorithm_count + a * algorithm_count + b] =
            make("dual_layer(" + std::string(algorithms[a]->name) + "," + std::string(algorithms[b]->name) + ")",
                 dual(*algorithms[a], *algorithms[b]));
      }
    }
    out[batch_script] = make("batch", batch());
    out[all_script] = make("all", all_or_nothing());
    out[lease_script] = make("lease", lease_single());
    out[lease_dual_script] = make("lease_dual", lease_dual());
    out[give_back_script] = make("give_back", time_and_deadline("ARGV[#ARGV]") + std::string(give_back_main));
    out[reset_script] = make("reset", time_and_deadline("ARGV[#ARGV]") + "return {redis.call('DEL', KEYS[1]), now}\n");
    return out;
  }();
  return all;
}

}  // namespace sluice::detail
