// SPDX-License-Identifier: Apache-2.0
#include "redis/command.hpp"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <limits>
#include <optional>
#include <utility>

#include "redis/exactness.hpp"
#include "redis/keys.hpp"
#include "redis/scripts.hpp"
#include "redis/slot.hpp"
#include "sluice/gcra.hpp"
#include "sluice/redis_backend.hpp"

namespace sluice::detail {
namespace {

// Appends one RESP bulk string: $len CRLF bytes CRLF.
void bulk(std::string& out, std::string_view s) {
  char head[24] = {'$'};
  char* end = std::to_chars(head + 1, head + sizeof head - 2, s.size()).ptr;
  *end++ = '\r';
  *end++ = '\n';
  out.append(head, end);
  out.append(s);
  out.append("\r\n", 2);
}

void bulk(std::string& out, std::size_t v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  bulk(out, std::string_view(buf, static_cast<std::size_t>(end - buf)));
}

// A number for a script: hex digits (scripts.hpp). Every number sent is >= 0.
void number(std::string& out, std::int64_t v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, static_cast<std::uint64_t>(std::max<std::int64_t>(0, v)), 16);
  bulk(out, std::string_view(buf, static_cast<std::size_t>(end - buf)));
}

// `now` for a script: a test clock's µs, or "-" (-1) for the server's TIME.
void now_number(std::string& out, std::int64_t now_us) {
  if (now_us < 0) {
    bulk(out, "-");
  } else {
    number(out, now_us);
  }
}

// The three script parameters of a policy (see scripts.hpp). Precondition: validate(p) and
// validate_for_redis(p) passed.
void append_params(std::string& out, const policy& p) {
  if (p.algorithm == algorithm::token_bucket) {
    // Integer ns, as in process: interval >= 1000 (or 0: infinite), tolerance <= 2^62.
    gcra_params g = make_gcra_params(p.rate, p.burst);
    number(out, g.interval_ns);
    number(out, g.tolerance_ns);
    number(out, g.burst);
    return;
  }
  // Whole µs, rounded up without overflow (window > 0); longer windows than max_window_us act as it.
  const std::int64_t w = p.window.count();
  const std::int64_t window_us = std::min(max_window_us, w / 1000 + (w % 1000 != 0 ? 1 : 0));
  number(out, p.limit);
  number(out, window_us);
  number(out, static_cast<std::int64_t>(p.calendar));  // fixed_window's calendar (0 for the others)
}

// The index an algorithm has in the lease and batch scripts (their `fs` tables).
std::int64_t algorithm_index(const policy& p) { return static_cast<std::int64_t>(p.algorithm); }

// The deadline's hex digits: fixed width, so set_deadline can rewrite them in place when the
// command is sent. -1 (none) is all f's, later than any time; any other value is a server time in µs.
constexpr std::size_t deadline_width = 16;

void write_deadline(char* out, std::int64_t v) {
  static constexpr char digits[] = "0123456789abcdef";
  std::fill(out, out + deadline_width, v < 0 ? 'f' : '0');
  for (std::size_t i = deadline_width; v > 0; v /= 16) out[--i] = digits[v % 16];
}

// The bulk strings EVALSHA and the script's hash, formatted once per script.
const std::string& evalsha_head(std::size_t script) {
  static const std::array<std::string, script_count> heads = [] {
    std::array<std::string, script_count> out;
    for (std::size_t i = 0; i < script_count; ++i) {
      bulk(out[i], "EVALSHA");
      bulk(out[i], scripts()[i].sha1);
    }
    return out;
  }();
  return heads[script];
}

// A script call's start: *argc, EVALSHA, the script's sha, numkeys (`argc` counts every bulk
// string, these four included). The keys come next.
void begin_call(command& cmd, std::size_t script, std::size_t argc, std::size_t numkeys) {
  std::string& c = cmd.text;
  c += '*';
  c += std::to_string(argc);
  c += "\r\n";
  cmd.header = c.size();
  c += evalsha_head(script);
  cmd.rest = c.size();
  bulk(c, numkeys);
  cmd.keys_at = c.size();
}

// Appends the deadline's fixed-width bulk string, set to `deadline_us`; returns where its digits are.
std::size_t append_deadline(std::string& out, std::int64_t deadline_us) {
  char digits[deadline_width];
  write_deadline(digits, deadline_us);
  bulk(out, std::string_view(digits, deadline_width));
  return out.size() - 2 - deadline_width;
}

// A script call's end: its deadline.
void end_call(command& cmd, std::int64_t deadline_us) { cmd.deadline_at = append_deadline(cmd.text, deadline_us); }

nanoseconds from_us(long long us) {
  if (us < 0) return never;
  if (us > std::numeric_limits<std::int64_t>::max() / 1000) return never;
  return nanoseconds(us * 1000);
}

// The values a check's layers reply with: four per layer.
std::size_t values_of(const prepared_script& p) { return p.dual ? 8 : 4; }

bool integers(const redisReply& r, std::size_t n, long long* out) {
  if (r.type != REDIS_REPLY_ARRAY || r.elements != n) return false;
  for (std::size_t i = 0; i < n; ++i) {
    if (r.element[i]->type != REDIS_REPLY_INTEGER) return false;
    out[i] = r.element[i]->integer;
  }
  return true;
}

// One layer's decision from its four reply values {allowed, remaining, retry µs, reset µs}.
decision layer_decision(const long long* v, std::int64_t limit) {
  decision d;
  d.allowed = v[0] == 1;
  d.limit = limit;
  d.remaining = std::max<long long>(0, v[1]);
  d.retry_after = d.allowed ? nanoseconds(0) : from_us(v[2]);
  d.reset_after = from_us(v[3]);  // -1 ("never") only for a bucket that cannot refill
  return d;
}

}  // namespace

result<prepared_script> prepare_script(const rule& r) {
  if (auto v = validate(r); !v) return v.error();
  if (auto v = sluice::validate_for_redis(r); !v) return v.error();
  prepared_script p;
  p.dual = r.is_dual_layer();
  p.limit = r.limit.capacity();
  p.script = p.dual ? dual_script(r.tenant->algorithm, r.limit.algorithm) : single_script(r.limit.algorithm);
  if (p.dual) {
    p.tenant_limit = r.tenant->capacity();
    p.tenant_tag = state_tag(*r.tenant);
    append_params(p.params, *r.tenant);
  }
  p.tag = state_tag(r.limit);
  append_params(p.params, r.limit);
  if (r.lease) {
    number(p.leased_params, algorithm_index(r.leased_layer()));
    append_params(p.leased_params, r.leased_layer());
    if (p.dual) {
      append_params(p.user_params, r.limit);
      p.user_script = single_script(r.limit.algorithm);
    }
  }
  return p;
}

command evalsha_command(const prepared_script& p, const rule& r, const check_request& req, std::string_view key_prefix,
                        std::int64_t now_us, std::int64_t deadline_us) {
  command cmd;
  std::string& c = cmd.text;
  c.reserve(256);
  // EVALSHA, sha, numkeys, the keys, now, cost, three parameters per layer, deadline.
  begin_call(cmd, p.script, p.dual ? 14 : 10, p.dual ? 2 : 1);
  if (p.dual) {
    const std::string tenant = tenant_key(key_prefix, r.name, req.tenant, p.tenant_tag);
    cmd.slot = key_slot(tenant);  // the user key's too: both carry the tenant's hash tag
    bulk(c, tenant);
    bulk(c, user_key(key_prefix, r.name, req.tenant, req.user, p.tag));
  } else {
    const std::string key = single_key(key_prefix, r.name, req.key, p.tag);
    cmd.slot = key_slot(key);
    bulk(c, key);
  }
  cmd.keys_end = c.size();
  now_number(c, now_us);
  cmd.args_at = c.size();
  number(c, req.cost);
  c += p.params;
  cmd.args_end = c.size();
  end_call(cmd, deadline_us);
  return cmd;
}

namespace {

// A script call: *argc, EVALSHA, sha, numkeys, keys..., now, `args` (`argc` bulk strings), deadline.
command script_call(std::size_t script, std::initializer_list<std::string_view> keys, std::int64_t now_us,
                    std::string_view args, std::size_t argc) {
  command cmd;
  std::string& c = cmd.text;
  begin_call(cmd, script, 3 + keys.size() + 1 + argc + 1, keys.size());
  for (std::string_view k : keys) bulk(c, k);
  cmd.keys_end = c.size();
  cmd.slot = key_slot(*keys.begin());  // they share it: the tenant's hash tag
  now_number(c, now_us);
  cmd.args_at = c.size();
  c += args;
  cmd.args_end = c.size();
  end_call(cmd, -1);
  return cmd;
}

// The key of the leased layer: the rule's, or a dual-layer rule's tenant's.
std::string leased_key(const prepared_script& p, const rule& r, const check_request& req, std::string_view prefix) {
  return p.dual ? tenant_key(prefix, r.name, req.tenant, p.tenant_tag) : single_key(prefix, r.name, req.key, p.tag);
}

}  // namespace

command lease_command(const prepared_script& p, const rule& r, const check_request& req, std::string_view key_prefix,
                      std::int64_t now_us, std::int64_t cost, std::int64_t want, std::int64_t hold_ns) {
  std::string args;
  number(args, cost);
  number(args, want);
  args += p.leased_params;
  number(args, hold_ns);
  const std::string leased = leased_key(p, r, req, key_prefix);
  if (!p.dual || cost == 0) return script_call(lease_script, {leased}, now_us, args, 7);
  number(args, static_cast<std::int64_t>(p.user_script));  // a single script's index is its algorithm's
  args += p.user_params;
  const std::string user = user_key(key_prefix, r.name, req.tenant, req.user, p.tag);
  return script_call(lease_dual_script, {leased, user}, now_us, args, 11);
}

command user_layer_command(const prepared_script& p, const rule& r, const check_request& req,
                           std::string_view key_prefix, std::int64_t now_us) {
  std::string args;
  number(args, req.cost);
  args += p.user_params;
  const std::string user = user_key(key_prefix, r.name, req.tenant, req.user, p.tag);
  return script_call(p.user_script, {user}, now_us, args, 4);
}

command give_back_command(const prepared_script& p, const rule& r, const check_request& req,
                          std::string_view key_prefix, std::int64_t now_us, std::string_view token,
                          std::int64_t units) {
  const policy& leased = r.leased_layer();
  std::string args;
  number(args, algorithm_index(leased));
  bulk(args, token);
  number(args, units);
  number(args,
         leased.algorithm == algorithm::token_bucket ? make_gcra_params(leased.rate, leased.burst).interval_ns : 0);
  return script_call(give_back_script, {leased_key(p, r, req, key_prefix)}, now_us, args, 4);
}

command reset_command(const prepared_script& p, const rule& r, const check_request& req, std::string_view key_prefix,
                      std::int64_t now_us) {
  const std::string key = !p.dual          ? single_key(key_prefix, r.name, req.key, p.tag)
                          : req.user.empty() ? tenant_key(key_prefix, r.name, req.tenant, p.tenant_tag)
                                             : user_key(key_prefix, r.name, req.tenant, req.user, p.tag);
  return script_call(reset_script, {key}, now_us, {}, 0);
}

void set_deadline(command& c, std::int64_t deadline_us) { write_deadline(c.text.data() + c.deadline_at, deadline_us); }

std::string eval_command(const command& c, std::string_view body) {
  std::string eval;
  eval.reserve(c.text.size() + body.size() + 32);
  eval.append(c.text, 0, c.header);
  bulk(eval, "EVAL");
  bulk(eval, body);
  eval.append(c.text, c.rest);
  return eval;
}

const std::string& oom_probe_command() {
  static const std::string probe = [] {
    std::string c = "*3\r\n";
    bulk(c, "EVAL");
    bulk(c, "#!lua\nreturn 1");
    bulk(c, "0");
    return c;
  }();
  return probe;
}

std::int64_t reply_time(const redisReply& r) noexcept {
  if (r.type != REDIS_REPLY_ARRAY || r.elements == 0) return -1;
  const redisReply* last = r.element[r.elements - 1];
  const bool valid = last->type == REDIS_REPLY_INTEGER && last->integer >= 0 && last->integer < (1LL << 53);
  return valid ? last->integer : -1;
}

bool is_expired_reply(const redisReply& r) noexcept {
  return r.type == REDIS_REPLY_ARRAY && r.elements == 2 && r.element[0]->type == REDIS_REPLY_INTEGER &&
         r.element[0]->integer == -1;
}

// The decision of one check's values (4 for one layer, 8 for two), or nullopt when an `allowed` is
// neither 0 nor 1.
std::optional<decision> decision_of(const prepared_script& p, const long long* v) {
  if ((v[0] != 0 && v[0] != 1) || (p.dual && v[4] != 0 && v[4] != 1)) return std::nullopt;
  if (!p.dual) return layer_decision(v, p.limit);
  return combine_layers(layer_decision(v, p.tenant_limit), layer_decision(v + 4, p.limit));  // as in process
}

result<decision> parse_reply(const prepared_script& p, const redisReply& r) {
  // Each reply ends with the server time (read by reply_time).
  long long v[9];
  std::optional<decision> d;
  if (integers(r, values_of(p) + 1, v)) d = decision_of(p, v);
  if (!d)
    return {errc::backend_protocol,
            p.dual ? "unexpected reply from the dual-layer script" : "unexpected reply from the rate-limit script"};
  return *d;
}

result<lease_reply> parse_lease_reply(const prepared_script& p, bool leased_alone, std::int64_t cost, std::int64_t want,
                                      const redisReply& r) {
  const bool both = p.dual && !leased_alone;
  const std::size_t values = both ? 8 : 4;  // then units, token, valid µs, now
  const auto bad = [] { return error(errc::backend_protocol, "unexpected reply from the lease script"); };
  if (r.type != REDIS_REPLY_ARRAY || r.elements != values + 4) return bad();
  long long v[12];
  for (std::size_t i = 0; i < r.elements; ++i) {
    const redisReply& e = *r.element[i];
    if (i == values + 1) {
      if (e.type != REDIS_REPLY_STRING || e.len > 256) return bad();
      continue;
    }
    if (e.type != REDIS_REPLY_INTEGER) return bad();
    v[i] = e.integer;
  }
  const std::int64_t leased_limit = p.dual ? p.tenant_limit : p.limit;
  std::optional<decision> d;
  if (both) {
    d = decision_of(p, v);
  } else if (v[0] == 0 || v[0] == 1) {
    d = layer_decision(v, leased_limit);
  }
  if (!d) return bad();
  lease_reply out;
  out.check = *d;
  out.leased = layer_decision(v, leased_limit);
  out.units = v[values];
  out.valid_us = v[values + 2];
  // A lease is 0 units (refused), or from the cost to what was asked for.
  if (out.units < 0 || out.units > want || (out.units > 0 && (!d->allowed || out.units < cost))) return bad();
  out.token.assign(r.element[values + 1]->str, r.element[values + 1]->len);
  return out;
}

namespace {

// Past the bulk string at `at` of a RESP text this file wrote ($len CRLF bytes CRLF).
std::size_t past_bulk(std::string_view text, std::size_t at) {
  const std::size_t crlf = text.find('\r', at);
  std::size_t len = 0;
  std::from_chars(text.data() + at + 1, text.data() + crlf, len);
  return crlf + 2 + len + 2;
}

}  // namespace

std::size_t batch_builder::set_of(std::size_t kind, std::string_view params, std::size_t count) {
  for (std::size_t i = 0; i < set_spans.size(); ++i) {
    const set_span& s = set_spans[i];
    if (s.kind == kind && std::string_view(sets).substr(s.at, s.size) == params) return i + 1;
  }
  number(sets, static_cast<std::int64_t>(kind));
  set_spans.push_back({kind, sets.size(), params.size()});
  sets += params;
  sets_argc += 1 + count;
  return set_spans.size();
}

void batch_builder::add(const command& c, std::size_t kind, int key_count) {
  if (checks == 0) now = c.now_argument();
  keys.append(c.text, c.keys_at, c.keys_end - c.keys_at);
  const std::size_t params_at = past_bulk(c.text, c.args_at);  // the cost's bulk string comes first
  const std::string_view params = std::string_view(c.text).substr(params_at, c.args_end - params_at);
  number(args, static_cast<std::int64_t>(set_of(kind, params, key_count == 2 ? 6 : 3)));
  args.append(c.text, c.args_at, params_at - c.args_at);
  numkeys += static_cast<std::size_t>(key_count);
  argc += 2;
  ++checks;
}

void set_record(command& c) { c.text[c.args_at + 4] = '1'; }  // the flag's bulk string: "$1\r\n0\r\n"

void batch_builder::add_group(const command& c, std::size_t count) {
  if (checks == 0) now = c.now_argument();
  keys.append(c.text, c.keys_at, c.keys_end - c.keys_at);
  number(args, 0);
  number(args, static_cast<std::int64_t>(count));
  args.append(c.text, c.args_at, c.args_end - c.args_at);  // whether to record, then five per check
  numkeys += count;
  argc += 3 + 5 * count;
  ++checks;
}

std::string batch_builder::text(std::int64_t deadline_us) const {
  std::string out;
  out.reserve(keys.size() + sets.size() + args.size() + 128);
  out += '*';
  out += std::to_string(3 + numkeys + 3 + sets_argc + argc);
  out += "\r\n";
  out += evalsha_head(batch_script);
  bulk(out, numkeys);
  out += keys;
  out += now;
  append_deadline(out, deadline_us);
  number(out, static_cast<std::int64_t>(set_spans.size()));
  out += sets;
  out += args;
  return out;
}

command all_command(const std::vector<command>& checks, const std::vector<std::size_t>& scripts_of, bool record) {
  command cmd;
  std::string& c = cmd.text;
  begin_call(cmd, all_script, 3 + checks.size() + 3 + 5 * checks.size(), checks.size());
  for (const command& k : checks) c.append(k.text, k.keys_at, k.keys_end - k.keys_at);
  cmd.keys_end = c.size();
  c += checks.front().now_argument();
  cmd.args_at = c.size();
  bulk(c, record ? "1" : "0");
  for (std::size_t i = 0; i < checks.size(); ++i) {
    number(c, static_cast<std::int64_t>(scripts_of[i]));
    c.append(checks[i].text, checks[i].args_at, checks[i].args_end - checks[i].args_at);
  }
  cmd.args_end = c.size();
  end_call(cmd, -1);
  cmd.slot = checks.front().slot;
  return cmd;
}

namespace {

// The whole number in the little-endian double at `p`, as Redis casts a script's number to an
// integer reply; nullopt for NaN, infinities and what no long long holds.
std::optional<long long> packed_value(const char* p) {
  std::uint64_t bits = 0;
  for (int i = 7; i >= 0; --i) bits = bits << 8 | static_cast<unsigned char>(p[i]);
  const double d = std::bit_cast<double>(bits);
  if (!(d > -9.2e18 && d < 9.2e18)) return std::nullopt;
  return static_cast<long long>(d);
}

}  // namespace

result<std::vector<decision>> parse_batch_reply(const std::vector<const prepared_script*>& checks,
                                                const redisReply& r) {
  std::size_t expected = 0;
  for (const prepared_script* p : checks) expected += values_of(*p);
  if (r.type != REDIS_REPLY_ARRAY || r.elements != 2 || r.element[0]->type != REDIS_REPLY_STRING ||
      r.element[0]->len != expected * 8 || r.element[1]->type != REDIS_REPLY_INTEGER) {
    return {errc::backend_protocol, "unexpected reply from the batch script"};
  }
  std::vector<long long> v(expected);
  for (std::size_t i = 0; i < expected; ++i) {
    auto value = packed_value(r.element[0]->str + 8 * i);
    if (!value) return {errc::backend_protocol, "unexpected reply from the batch script"};
    v[i] = *value;
  }
  std::vector<decision> out;
  out.reserve(checks.size());
  std::size_t at = 0;
  for (const prepared_script* p : checks) {
    auto d = decision_of(*p, v.data() + at);
    if (!d) return {errc::backend_protocol, "unexpected reply from the batch script"};
    out.push_back(*d);
    at += values_of(*p);
  }
  return out;
}

std::int64_t parse_time_reply(const redisReply& r) noexcept {
  if (r.type != REDIS_REPLY_ARRAY || r.elements != 2) return -1;
  const redisReply* a = r.element[0];
  const redisReply* b = r.element[1];
  if (a->type != REDIS_REPLY_STRING || b->type != REDIS_REPLY_STRING) return -1;
  long long sec = 0, usec = 0;
  auto [p1, e1] = std::from_chars(a->str, a->str + a->len, sec);
  auto [p2, e2] = std::from_chars(b->str, b->str + b->len, usec);
  if (e1 != std::errc() || e2 != std::errc() || sec < 0 || sec > (1LL << 40) || usec < 0 || usec > 999'999) {
    return -1;
  }
  return sec * 1'000'000 + usec;
}

}  // namespace sluice::detail
