// SPDX-License-Identifier: Apache-2.0
// keyed_table.hpp (private) — one limiter state per key, in a sharded open-addressing hash table
// with a hard cap on the number of keys.
//
// Layout: 2^k shards, each a mutex and a linear-probing table of slots {State, 16-byte key}. Keys of
// up to 15 bytes live inside the slot; longer ones on the heap. With gcra_state a slot is 24 bytes;
// at a load factor between 3/8 and 3/4 that is 32 to 64 bytes per key (+ the key's heap copy when
// it is longer than 15 bytes).
//
// Memory is bounded: an entry whose state is idle (idle_at <= now) is dropped when the shard grows
// (dropping it changes no decision: a full bucket or an empty window is what a new key gets). When a
// shard is at its cap, a new key first sweeps out all idle entries (at most once per cap/8 new keys),
// else drops an idle entry among a sample of 8. When none of those is idle, `when_full` decides:
// evict the sampled entry that uses the least of its capacity (it carries the least information;
// that key then starts afresh), or refuse the new key. Each outcome is counted (stats()).
//
// Thread-safe: every operation locks one shard (with_entry_pair locks two, in a fixed order).
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <string_view>
#include <utility>
#include <vector>

#include <sys/mman.h>

#include "keyed/siphash.hpp"
#include "sluice/error.hpp"
#include "sluice/keyed.hpp"
#include "sluice/policy.hpp"

namespace sluice::detail {

/// A key in 16 bytes: up to 15 bytes inline, longer ones in a heap buffer it owns.
class stored_key {
 public:
  static constexpr std::size_t inline_capacity = 15;

  stored_key() noexcept = default;
  stored_key(const stored_key&) = delete;
  stored_key& operator=(const stored_key&) = delete;
  stored_key(stored_key&& o) noexcept { steal(o); }
  stored_key& operator=(stored_key&& o) noexcept {
    if (this != &o) {
      reset();
      steal(o);
    }
    return *this;
  }
  ~stored_key() { reset(); }

  bool empty() const noexcept { return tag_ == empty_tag; }

  void assign(std::string_view key) {
    reset();
    if (key.size() <= inline_capacity) {
      std::memcpy(bytes_, key.data(), key.size());
      tag_ = static_cast<std::uint8_t>(key.size() + 1);  // 1..16: inline, length + 1
      return;
    }
    char* p = new char[key.size()];
    std::memcpy(p, key.data(), key.size());
    auto len = static_cast<std::uint32_t>(key.size());
    std::memcpy(bytes_, &p, sizeof p);
    std::memcpy(bytes_ + sizeof p, &len, sizeof len);
    tag_ = heap_tag;
  }

  std::string_view view() const noexcept {
    if (tag_ == heap_tag) {
      char* p;
      std::uint32_t len;
      std::memcpy(&p, bytes_, sizeof p);
      std::memcpy(&len, bytes_ + sizeof p, sizeof len);
      return {p, len};
    }
    return tag_ == empty_tag ? std::string_view{} : std::string_view{bytes_, static_cast<std::size_t>(tag_ - 1)};
  }

  /// Heap bytes owned (0 for inline keys).
  std::size_t heap_bytes() const noexcept { return tag_ == heap_tag ? view().size() : 0; }

  void reset() noexcept {
    if (tag_ == heap_tag) {
      char* p;
      std::memcpy(&p, bytes_, sizeof p);
      delete[] p;
    }
    tag_ = empty_tag;
  }

 private:
  static constexpr std::uint8_t empty_tag = 0;
  static constexpr std::uint8_t heap_tag = 0xff;

  void steal(stored_key& o) noexcept {
    std::memcpy(bytes_, o.bytes_, sizeof bytes_);
    tag_ = o.tag_;
    o.tag_ = empty_tag;
  }

  char bytes_[inline_capacity]{};
  std::uint8_t tag_ = empty_tag;
};
static_assert(sizeof(stored_key) == 16);

/// Allocates arrays of 2 MiB and more on transparent huge pages (asked for with madvise), so that
/// random access to a large table misses the TLB far less; smaller ones come from operator new.
template <class T>
struct huge_page_allocator {
  using value_type = T;
  static constexpr std::size_t huge_page = std::size_t{2} << 20;

  huge_page_allocator() noexcept = default;
  template <class U>
  huge_page_allocator(const huge_page_allocator<U>&) noexcept {}  // NOLINT: rebinding

  T* allocate(std::size_t n) {
    const std::size_t bytes = n * sizeof(T);
    if (bytes < huge_page) return std::allocator<T>{}.allocate(n);
    const std::size_t rounded = (bytes + huge_page - 1) / huge_page * huge_page;
    void* p = std::aligned_alloc(huge_page, rounded);
    if (p == nullptr) throw std::bad_alloc();
    ::madvise(p, rounded, MADV_HUGEPAGE);  // advice only: failure leaves ordinary pages
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if (n * sizeof(T) < huge_page) return std::allocator<T>{}.deallocate(p, n);
    std::free(p);
  }
  friend bool operator==(huge_page_allocator, huge_page_allocator) noexcept { return true; }
};

template <class State, class Params>
class keyed_table {
  struct shard;  // below

 public:
  using state_type = State;
  using params_type = Params;

  /// `max_keys` is the hard cap over all shards (>= 1).
  keyed_table(Params params, std::size_t max_keys, State initial, sluice::when_full full = when_full::evict)
      : initial_(std::move(initial)), when_full_(full) {
    // Few shards for small caps keep the cap exact; 16 for large ones spread the locks and keep
    // each shard's array large enough for huge pages.
    std::size_t shards = std::clamp<std::size_t>(std::bit_floor(std::max<std::size_t>(max_keys / 1024, 1)), 1, 16);
    shard_bits_ = std::countr_zero(shards);
    shard_cap_ = std::max<std::size_t>(max_keys / shards, 1);
    shards_ = std::make_unique<shard[]>(shards);
    for (std::size_t i = 0; i < shards; ++i) shards_[i].params = params;
  }

  /// Gives every entry new parameters of the same algorithm and window: `convert(State&, old, new)`
  /// carries each entry's state over (see limiter_state::retune), one shard lock at a time. A check
  /// meanwhile sees its shard either before or after, never between.
  template <class Convert>
  void retune(const Params& params, Convert&& convert) {
    for (std::size_t i = 0; i < shard_count(); ++i) {
      shard& sh = shards_[i];
      std::lock_guard lock(sh.mutex);
      for (slot& e : sh.slots) {
        if (!e.key.empty()) convert(e.state, sh.params, params);
      }
      sh.params = params;
    }
  }

  /// Finds or creates the entry for `key` and returns fn(State&, const Params&), called under its
  /// shard's lock with the parameters in force;
  /// errc::capacity_exhausted when the key is new and the table refuses it (when_full::refuse).
  template <class Fn>
  auto with_entry(std::string_view key, std::int64_t now, Fn&& fn)
      -> result<decltype(fn(std::declval<State&>(), std::declval<const Params&>()))> {
    const std::uint64_t h = hash(key);
    shard& s = shard_for(h);
    std::lock_guard lock(s.mutex);
    State* e = find_or_insert(s, key, h, now);
    if (e == nullptr) return full_error();
    return fn(*e, s.params);
  }

  /// Drops `key`'s entry: the key starts again full, as one never seen. False when there was none.
  bool forget(std::string_view key) {
    const std::uint64_t h = hash(key);
    shard& s = shard_for(h);
    std::lock_guard lock(s.mutex);
    if (s.slots.empty()) return false;
    const std::size_t i = find(s, key, h);
    if (i == npos) return false;
    erase(s, i);
    return true;
  }

  /// As with_entry for a key of `first` and a key of `second`, both locked (first's shard first),
  /// calling fn(State1&, Params1&, State2&, Params2&). `first` and `second` must be different tables, and every caller
  /// must pass a given pair of tables in the same order. A refused new tenant key leaves the user
  /// table untouched; a refused new user key leaves the tenant's entry as it was (possibly new).
  template <class OtherTable, class Fn>
  friend auto with_entry_pair(keyed_table& first, std::string_view k1, OtherTable& second, std::string_view k2,
                              std::int64_t now, Fn&& fn)
      -> result<decltype(fn(std::declval<State&>(), std::declval<const Params&>(),
                            std::declval<typename OtherTable::state_type&>(),
                            std::declval<const typename OtherTable::params_type&>()))> {
    const std::uint64_t h1 = first.hash(k1);
    shard& s1 = first.shard_for(h1);
    std::lock_guard lock1(s1.mutex);
    State* e1 = first.find_or_insert(s1, k1, h1, now);
    if (e1 == nullptr) return full_error();
    return second.with_entry(k2, now, [&](auto& e2, const auto& p2) { return fn(*e1, s1.params, e2, p2); });
  }

  /// For a check over several entries at once (keyed_limiter::try_acquire_all), which locks their
  /// shards itself, in address order: where `key` lives, and with that shard's mutex held, its
  /// entry and parameters.
  struct place {
    shard* where = nullptr;
    std::uint64_t hash = 0;
    std::mutex& mutex() const noexcept { return where->mutex; }
    const void* where_id() const noexcept { return where; }  // tells shards apart
    const Params& params() const noexcept { return where->params; }
  };
  place locate(std::string_view key) noexcept {
    const std::uint64_t h = hash(key);
    return {&shard_for(h), h};
  }
  /// The entry, made if new (which may move the shard's others, or drop idle ones); nullptr when
  /// the table refuses it.
  State* entry_at(const place& p, std::string_view key, std::int64_t now) {
    return find_or_insert(*p.where, key, p.hash, now);
  }
  /// Makes room in p's shard for `extra` more entries, so that making them rebuilds nothing (a
  /// rebuild drops idle entries, and a fresh entry is idle). At the key cap it cannot.
  void reserve_at(const place& p, std::size_t extra, std::int64_t now) {
    shard& s = *p.where;
    if (s.size < shard_cap_ && (s.size + extra + 1) * 4 > s.slots.size() * 3) rebuild(s, now, extra);
  }
  /// The entry if present; moves nothing.
  State* existing_at(const place& p, std::string_view key) noexcept {
    if (p.where->slots.empty()) return nullptr;
    const std::size_t i = find(*p.where, key, p.hash);
    return i == npos ? nullptr : &p.where->slots[i].state;
  }
  static error full_error() {
    return {errc::capacity_exhausted, "the limiter holds its maximum number of keys, all in use: new keys are refused"};
  }

  /// What happened at the key cap so far.
  key_cap_stats stats() const {
    key_cap_stats c;
    for_each_shard([&](const shard& s) {
      c.evicted_idle += s.counts.evicted_idle;
      c.evicted_active += s.counts.evicted_active;
      c.refused += s.counts.refused;
    });
    return c;
  }

  /// Live entries (idle ones included until they are dropped).
  std::size_t size() const {
    std::size_t n = 0;
    for_each_shard([&](const shard& s) { n += s.size; });
    return n;
  }

  /// Bytes held by the table: slots (at their capacity) plus heap copies of long keys. Excludes
  /// memory owned by states themselves (a sliding window log's timestamps).
  std::size_t memory_bytes() const {
    std::size_t n = sizeof(*this) + shard_count() * sizeof(shard);
    for_each_shard([&](const shard& s) { n += s.slots.capacity() * sizeof(slot) + s.heap_bytes; });
    return n;
  }

  /// Drops every idle entry now (the table also does this lazily as it grows).
  void sweep(std::int64_t now) {
    for (std::size_t i = 0; i < shard_count(); ++i) {
      std::lock_guard lock(shards_[i].mutex);
      rebuild(shards_[i], now);
    }
  }

 private:
  struct slot {
    State state;
    stored_key key;
  };

  struct alignas(64) shard {  // one cache line apart: no false sharing between shard locks
    std::mutex mutex;
    Params params;                                       // the same in every shard but while retune() runs
    std::vector<slot, huge_page_allocator<slot>> slots;  // size a power of two, or empty
    std::size_t size = 0;
    std::size_t heap_bytes = 0;
    std::size_t inserts_since_sweep = 0;
    key_cap_stats counts;
  };

  // Keys come from outside: a secret per-table key keeps chosen-collision floods out.
  std::uint64_t hash(std::string_view key) const noexcept { return hash_(key); }

  std::size_t shard_count() const noexcept { return std::size_t{1} << shard_bits_; }
  shard& shard_for(std::uint64_t h) noexcept { return shards_[shard_bits_ == 0 ? 0 : h >> (64 - shard_bits_)]; }

  template <class Fn>
  void for_each_shard(Fn&& fn) const {
    for (std::size_t i = 0; i < shard_count(); ++i) {
      std::lock_guard lock(shards_[i].mutex);
      fn(shards_[i]);
    }
  }

  static bool is_idle(const shard& s, const slot& e, std::int64_t now) noexcept {
    return e.state.idle_at(s.params) <= now;
  }

  static std::size_t find(const shard& s, std::string_view key, std::uint64_t h) noexcept {
    const std::size_t mask = s.slots.size() - 1;
    for (std::size_t i = h & mask;; i = (i + 1) & mask) {
      const slot& e = s.slots[i];
      if (e.key.empty()) return npos;
      if (e.key.view() == key) return i;
    }
  }

  // nullptr when the key is new and the table refuses it.
  State* find_or_insert(shard& s, std::string_view key, std::uint64_t h, std::int64_t now) {
    if (!s.slots.empty()) {
      if (std::size_t i = find(s, key, h); i != npos) return &s.slots[i].state;
    }
    if (s.size >= shard_cap_) {
      // At the cap: sweep out every idle entry, at most once per cap/8 insertions so that a key
      // flood costs O(8) slot visits per new key; when nothing idle is left, evict by sampling.
      if (s.inserts_since_sweep >= std::max<std::size_t>(shard_cap_ / 8, 1)) {
        rebuild(s, now);
        s.inserts_since_sweep = 0;
      }
      if (s.size >= shard_cap_ && !evict_one(s, h, now)) return nullptr;
    } else if ((s.size + 1) * 4 > s.slots.size() * 3) {
      rebuild(s, now);
    }
    ++s.inserts_since_sweep;
    slot& e = s.slots[insert_position(s, h)];
    e.key.assign(key);
    e.state = initial_;
    s.heap_bytes += e.key.heap_bytes();
    ++s.size;
    return &e.state;
  }

  static std::size_t insert_position(const shard& s, std::uint64_t h) noexcept {
    const std::size_t mask = s.slots.size() - 1;
    std::size_t i = h & mask;
    while (!s.slots[i].key.empty()) i = (i + 1) & mask;
    return i;
  }

  // Re-inserts the entries that are not idle into a table at most half full: dropping idle entries
  // may make growing unnecessary, and sweep() may shrink the table.
  // Drops the idle entries, with room for the live ones and `extra` more.
  void rebuild(shard& s, std::int64_t now, std::size_t extra = 0) {
    auto old = std::move(s.slots);
    std::size_t live = 0;
    for (const slot& e : old) live += (!e.key.empty() && !is_idle(s, e, now)) ? 1 : 0;
    s.slots = decltype(s.slots)(std::bit_ceil(std::max<std::size_t>(8, 2 * (live + extra + 1))));
    s.size = 0;
    s.heap_bytes = 0;
    for (slot& e : old) {
      if (e.key.empty() || is_idle(s, e, now)) continue;
      slot& dst = s.slots[insert_position(s, hash(e.key.view()))];
      s.heap_bytes += e.key.heap_bytes();
      dst = std::move(e);
      ++s.size;
    }
  }

  // The share of its capacity an entry uses now, in [0, 1]: what evicting it would forget.
  static double used_share(const shard& s, slot& e, std::int64_t now) {
    const decision d = e.state.evaluate(s.params, now, 1);
    if (d.limit <= 0) return 0;
    const std::int64_t remaining_now = d.allowed ? d.remaining + 1 : d.remaining;
    return static_cast<double>(d.limit - remaining_now) / static_cast<double>(d.limit);
  }

  // At the cap: drops an idle entry among 8 sampled, else (when_full::evict) the sampled entry using
  // the least of its capacity. False when nothing was dropped (when_full::refuse).
  bool evict_one(shard& s, std::uint64_t h, std::int64_t now) {
    const std::size_t mask = s.slots.size() - 1;
    const std::size_t sample = std::min<std::size_t>(8, s.size);
    std::size_t victim = npos;
    double victim_share = 2;
    for (std::size_t i = (h >> 24) & mask, seen = 0; seen < sample; i = (i + 1) & mask) {
      slot& e = s.slots[i];
      if (e.key.empty()) continue;
      ++seen;
      if (is_idle(s, e, now)) {
        ++s.counts.evicted_idle;
        erase(s, i);
        return true;
      }
      if (when_full_ == when_full::refuse) continue;
      const double share = used_share(s, e, now);
      if (share < victim_share) {
        victim = i;
        victim_share = share;
      }
    }
    if (victim == npos) {
      ++s.counts.refused;
      return false;
    }
    ++s.counts.evicted_active;
    erase(s, victim);
    return true;
  }

  // Backward-shift deletion: no tombstones, probe chains stay short.
  void erase(shard& s, std::size_t i) {
    const std::size_t mask = s.slots.size() - 1;
    s.heap_bytes -= s.slots[i].key.heap_bytes();
    s.slots[i].key.reset();
    --s.size;
    for (std::size_t j = (i + 1) & mask; !s.slots[j].key.empty(); j = (j + 1) & mask) {
      const std::size_t home = hash(s.slots[j].key.view()) & mask;
      // Leave slot j where it is if its home lies cyclically in (i, j].
      const bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
      if (stays) continue;
      s.slots[i] = std::move(s.slots[j]);
      i = j;
    }
  }

  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

  const State initial_;
  const keyed_hash hash_;
  const sluice::when_full when_full_;
  unsigned shard_bits_ = 0;
  std::size_t shard_cap_ = 1;
  std::unique_ptr<shard[]> shards_;
};

}  // namespace sluice::detail
