// accounting.h — the one place the block and segment counters change.
//
// Design note
// -----------
// Every counter that depends on blocks (allocations, active blocks, requested
// bytes, free pieces of split segments, oversize allocations) is a function of
// one block's state: its footprint(). A state change is written as a Ledger
// around it:
//
//     Ledger ledger(stats_, kind, max_split_size);
//     ledger.remove(block);   // what it counted before
//     ... change the block, split it, merge it ...
//     ledger.add(block);      // what it counts now
//     ledger.post();          // one signed add per counter that changed
//
// The ledger posts the *net* change of each counter, so torch's running totals
// (`allocated`, `freed`) see a transition as torch's hand-written updates did:
// splitting an already split free block shrinks inactive_split_bytes by the
// part handed out, it does not free the old size and allocate the rest.
// Segment counters (segment, reserved_bytes, oversize_segments and the device
// call counters) change through the same ledger, one call per device call:
//
//     ledger.segment_obtained(size)   // a plain segment from the backend
//     ledger.segment_released(size)   // ... given back
//     ledger.pages_mapped(bytes)      // pages mapped into an expandable segment
//     ledger.pages_unmapped(bytes)    // ... unmapped from it
//
// A plain segment counts as one segment, its size in reserved bytes, and one
// oversize segment when at least max_split_size; an expandable segment counts
// its mapped bytes only (torch). These apply at once (a device call is never on
// the hot path); the walker (validate.cpp) recomputes segment, reserved_bytes
// and oversize_segments from the segments and compares.
//
// A block is active while it counts requested bytes: from malloc until it is
// reusable again (free_block clears them), which covers blocks waiting on
// stream events (Note [record_stream]). Expandable segments' free blocks never
// count as inactive split (torch).
//
// Note [shapes]: a transition usually knows what state a block is in, e.g.
// malloc takes a free block and hands it out allocated. Saying so
// (`ledger.remove<Shape::kFree>(block)`) lets the compiler drop the tests the
// footprint would make and the counters that cannot change: the hot pair
// posts what torch's hand-written updates posted and nothing more. Where
// assertions are on, the shape is checked against the block; everywhere, a
// wrong shape leaves counters that disagree with the blocks, which the
// invariant walker (validate.cpp) reports (the C++ stress tests do).
#pragma once

#include <cassert>
#include <cstdint>

#include "block.h"
#include "stats.h"

namespace amem {

#define AMEM_INLINE inline __attribute__((always_inline))

// X(counter) — the pool counters that are a sum over blocks (names in stats.h).
#define AMEM_BLOCK_STATS(X) \
  X(allocation)             \
  X(allocated_bytes)        \
  X(active)                 \
  X(active_bytes)           \
  X(requested_bytes)        \
  X(inactive_split)         \
  X(inactive_split_bytes)

struct Footprint {
#define AMEM_FOOTPRINT_FIELD(name) int64_t name = 0;
  AMEM_BLOCK_STATS(AMEM_FOOTPRINT_FIELD)
#undef AMEM_FOOTPRINT_FIELD
  int64_t oversize_allocations = 0;  // a single stat (stats.h), not per pool
};

// What a transition knows about a block it adds or removes (Note [shapes]).
enum class Shape {
  kAny,        // read from the block
  kAllocated,  // handed to a caller (allocated, requested bytes counted)
  kFreed,      // freed by its caller, not yet reusable (requested bytes still counted)
  kFree,       // reusable or unmapped: counts at most as an inactive split block
  kFreePiece,  // kFree, and one of several blocks of its segment (a split's rest, a merged neighbour)
};

class Ledger {
 public:
  Ledger(Stats& stats, PoolKind kind, size_t max_split_size)
      : stats_(stats), kind_(kind), max_split_size_(max_split_size) {}
  Ledger(const Ledger&) = delete;
  Ledger& operator=(const Ledger&) = delete;

  // Inlined at each transition, the deltas stay in registers (the hot pair's
  // accounting costs what the hand-written updates cost).
  template <Shape S = Shape::kAny>
  AMEM_INLINE void add(const Block* b) { tally<S>(b, 1); }
  template <Shape S = Shape::kAny>
  AMEM_INLINE void remove(const Block* b) { tally<S>(b, -1); }
  // ------------------------------------------------------------ segments and pages
  void segment_obtained(size_t size) {
    stats_.num_device_alloc += 1;
    stats_.segment.increase(kind_, 1);
    if (size >= max_split_size_) stats_.oversize_segments.increase(1);
    reserve(size);
  }
  void segment_released(size_t size) {
    stats_.num_device_free += 1;
    stats_.segment.decrease(kind_, 1);
    if (size >= max_split_size_) stats_.oversize_segments.decrease(1);
    stats_.reserved_bytes.decrease(kind_, static_cast<int64_t>(size));
  }
  void pages_mapped(size_t bytes) {
    stats_.num_device_alloc += 1;  // torch counts each map as a device allocation
    stats_.num_device_map += 1;
    reserve(bytes);
  }
  void pages_unmapped(size_t bytes) {
    stats_.num_device_free += 1;
    stats_.num_device_unmap += 1;
    stats_.reserved_bytes.decrease(kind_, static_cast<int64_t>(bytes));
  }

  // Applies the net changes, an increase or a decrease per counter that
  // changed, and starts afresh. A delta the shapes fix at compile time costs
  // nothing (zero) or posts without a test (its sign known).
  AMEM_INLINE void post() {
#define AMEM_POST(name) post_one(stats_.name, delta_.name);
    AMEM_BLOCK_STATS(AMEM_POST)
#undef AMEM_POST
    post_one(stats_.oversize_allocations, delta_.oversize_allocations);
    delta_ = Footprint();
  }

 private:
  // Reserved bytes grow; at a new peak, fragmentation is measured from there
  // (Note [fragmentation at the peak], caching_allocator.cpp).
  void reserve(size_t bytes) {
    const int64_t old_peak = stats_.reserved_bytes.peak();
    stats_.reserved_bytes.increase(kind_, static_cast<int64_t>(bytes));
    if (stats_.reserved_bytes.current() > old_peak) stats_.allocated_at_reserved_peak = stats_.allocated_bytes.current();
  }

  // The one definition of a block's footprint (the design note above).
  template <Shape S>
  AMEM_INLINE void tally(const Block* b, int64_t sign) {
    const bool allocated = S == Shape::kAny ? b->allocated : S == Shape::kAllocated;
    const bool active = S == Shape::kAny ? b->requested != 0 : S < Shape::kFree;  // see the note above
    const bool split = S == Shape::kFreePiece || b->is_split();
    assert(allocated == b->allocated && active == (b->requested != 0) && split == b->is_split());
    const auto bytes = static_cast<int64_t>(b->size);
    if (bytes < 0) __builtin_unreachable();  // lets the compiler know each delta's sign
    const int64_t size = bytes * sign;
    if (allocated) {
      delta_.allocation += sign;
      delta_.allocated_bytes += size;
      if (b->size >= max_split_size_) delta_.oversize_allocations += sign;
    }
    if (active) {
      const auto requested = static_cast<int64_t>(b->requested);
      if (requested < 0) __builtin_unreachable();
      delta_.active += sign;
      delta_.active_bytes += size;
      delta_.requested_bytes += requested * sign;
    } else if (!allocated && split && !b->segment->expandable) {  // unmapped blocks are all in expandable segments
      delta_.inactive_split += sign;
      delta_.inactive_split_bytes += size;
    }
  }

  // A known sign needs no test; zero is no change either way.
  template <typename Counter>
  AMEM_INLINE void post_one(Counter& counter, int64_t delta) {
    if (__builtin_constant_p(delta == 0) && delta == 0) return;
    if (__builtin_constant_p(delta >= 0) && delta >= 0) increase(counter, delta);
    else if (__builtin_constant_p(delta <= 0) && delta <= 0) decrease(counter, -delta);
    else if (delta > 0) increase(counter, delta);
    else if (delta < 0) decrease(counter, -delta);
  }
  AMEM_INLINE void increase(PoolStat& counter, int64_t n) { counter.increase(kind_, n); }
  AMEM_INLINE void increase(Stat& counter, int64_t n) { counter.increase(n); }
  AMEM_INLINE void decrease(PoolStat& counter, int64_t n) { counter.decrease(kind_, n); }
  AMEM_INLINE void decrease(Stat& counter, int64_t n) { counter.decrease(n); }

  Stats& stats_;
  PoolKind kind_;
  size_t max_split_size_;
  Footprint delta_;
};

}  // namespace amem
