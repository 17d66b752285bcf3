// stats.h — every counter the allocator keeps, declared once.
//
// Design note
// -----------
// The counters are X-macro lists, so the struct, the reset functions and the
// JSON export are generated from one declaration and cannot drift apart (the
// native allocator updates stats by hand in many places; we keep a list).
// Names follow torch.cuda.memory_stats() so existing tools read them unchanged:
// a pool stat `allocated_bytes` exports `allocated_bytes.{all,small_pool,
// large_pool}.{current,peak,allocated,freed}`. Python reads the JSON, never the
// struct layout. Stats are guarded by the allocator's lock.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "size_policy.h"

namespace amem {

// X(name, meaning) — kept per pool (all / small_pool / large_pool).
#define AMEM_POOL_STATS(X)                                                        \
  X(allocation, "blocks handed to callers")                                       \
  X(segment, "segments obtained from the backend")                                \
  X(active, "blocks allocated or waiting on stream events")                       \
  X(inactive_split, "free blocks that are part of a split segment")               \
  X(allocated_bytes, "bytes in blocks handed to callers (rounded sizes)")         \
  X(reserved_bytes, "bytes in segments obtained from the backend")                \
  X(active_bytes, "bytes in active blocks")                                       \
  X(inactive_split_bytes, "bytes in free blocks of split segments")               \
  X(requested_bytes, "bytes callers asked for (before rounding)")

// X(name, meaning) — one {current, peak, allocated, freed} each, not per pool.
#define AMEM_SINGLE_STATS(X)                                                      \
  X(oversize_allocations, "allocations of at least max_split_size")               \
  X(oversize_segments, "segments of at least max_split_size")

// X(name, meaning) — plain event counters.
#define AMEM_COUNTERS(X)                                                          \
  X(num_alloc_retries, "backend allocations retried after freeing the cache")     \
  X(num_ooms, "requests that failed with out of memory")                          \
  X(num_sync_all_streams, "synchronizations before releasing memory")             \
  X(num_device_alloc, "segments allocated from the backend")                      \
  X(num_device_free, "segments returned to the backend")                          \
  X(num_device_map, "page runs mapped into expandable segments (also in num_device_alloc)") \
  X(num_device_unmap, "page runs unmapped from expandable segments (also in num_device_free)") \
  X(num_invalid_frees, "frees of pointers not allocated here, or freed twice")    \
  X(num_empty_cache, "empty_cache calls")

// Kept lean because every malloc and free updates several: a decrease is one
// subtraction, and `freed` is derived (what was added minus what is still
// there, counted from the last reset).
struct Stat {
  int64_t current = 0;
  int64_t peak = 0;
  int64_t allocated = 0;  // total added since the last reset_accumulated
  int64_t base = 0;       // `current` at the last reset_accumulated

  void increase(int64_t n) {
    current += n;
    allocated += n;
    if (current > peak) peak = current;
  }
  void decrease(int64_t n) { current -= n; }
  void add(int64_t n) { n >= 0 ? increase(n) : decrease(-n); }  // a signed change (accounting.h)
  int64_t freed() const { return allocated - (current - base); }  // total removed since the reset
  void reset_peak() { peak = current; }
  void reset_accumulated() {
    allocated = 0;
    base = current;
  }
};

// One figure per pool plus their sum ("all"). The sum keeps its own current
// and peak (the peak of a sum is not the sum of the peaks); its allocated and
// freed are the pools' sums, computed when read.
struct PoolStat {
  std::array<Stat, 2> pools;  // small, large
  int64_t all_current = 0;
  int64_t all_peak = 0;

  inline __attribute__((always_inline)) void increase(PoolKind pool, int64_t n) {
    pools[static_cast<int>(pool)].increase(n);
    all_current += n;
    if (all_current > all_peak) all_peak = all_current;
  }
  void decrease(PoolKind pool, int64_t n) {
    pools[static_cast<int>(pool)].decrease(n);
    all_current -= n;
  }
  void add(PoolKind pool, int64_t n) { n >= 0 ? increase(pool, n) : decrease(pool, -n); }  // signed
  // Index 0 = all, 1 = small_pool, 2 = large_pool (torch's export order).
  Stat by_pool(int index) const {
    if (index > 0) return pools[index - 1];
    return {all_current, all_peak, pools[0].allocated + pools[1].allocated, pools[0].base + pools[1].base};
  }
  int64_t current() const { return all_current; }
  int64_t peak() const { return all_peak; }
  void reset_peak() {
    for (Stat& s : pools) s.reset_peak();
    all_peak = all_current;
  }
  void reset_accumulated() {
    for (Stat& s : pools) s.reset_accumulated();
  }
};

struct Stats {
#define AMEM_DECLARE_POOL(name, doc) PoolStat name;
  AMEM_POOL_STATS(AMEM_DECLARE_POOL)
#undef AMEM_DECLARE_POOL
#define AMEM_DECLARE_SINGLE(name, doc) Stat name;
  AMEM_SINGLE_STATS(AMEM_DECLARE_SINGLE)
#undef AMEM_DECLARE_SINGLE
#define AMEM_DECLARE_COUNTER(name, doc) int64_t name = 0;
  AMEM_COUNTERS(AMEM_DECLARE_COUNTER)
#undef AMEM_DECLARE_COUNTER

  // Fragmentation at the reserved peak: allocated bytes when reserved last
  // reached its peak (reset together with the peaks).
  int64_t allocated_at_reserved_peak = 0;

  void reset_peaks();
  void reset_accumulated();
  // Flat torch-style JSON: {"allocated_bytes.all.current": 0, ...}.
  std::string to_json(size_t max_split_size) const;
};

}  // namespace amem
