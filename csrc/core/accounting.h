// accounting.h — the one place the block counters change.
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
// Segment counters (segment, reserved_bytes, oversize_segments) change where
// segments and pages come and go (caching_allocator.cpp: note_segment_*).
//
// A block is active while it counts requested bytes: from malloc until it is
// reusable again (free_block clears them), which covers blocks waiting on
// stream events (Note [record_stream]). Expandable segments' free blocks never
// count as inactive split (torch).
#pragma once

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

class Ledger {
 public:
  Ledger(Stats& stats, PoolKind kind, size_t max_split_size)
      : stats_(stats), kind_(kind), max_split_size_(max_split_size) {}
  Ledger(const Ledger&) = delete;
  Ledger& operator=(const Ledger&) = delete;

  // Inlined at each transition, the deltas stay in registers (the hot pair's
  // accounting costs what the hand-written updates cost).
  AMEM_INLINE void add(const Block* b) { tally(b, 1); }
  AMEM_INLINE void remove(const Block* b) { tally(b, -1); }
  // Applies the net changes, an increase or a decrease per counter that
  // changed, and starts afresh. Each counter is tested on its own: with the
  // deltas in registers that is cheaper than tracking which ones a tally
  // touched (callgrind, the hot malloc/free pair).
  AMEM_INLINE void post() {
#define AMEM_POST(name)                                         \
  if (delta_.name > 0) stats_.name.increase(kind_, delta_.name);  \
  else if (delta_.name < 0) stats_.name.decrease(kind_, -delta_.name);
    AMEM_BLOCK_STATS(AMEM_POST)
#undef AMEM_POST
    if (delta_.oversize_allocations > 0) stats_.oversize_allocations.increase(delta_.oversize_allocations);
    else if (delta_.oversize_allocations < 0) stats_.oversize_allocations.decrease(-delta_.oversize_allocations);
    delta_ = Footprint();
  }

 private:
  AMEM_INLINE void tally(const Block* b, int64_t sign) {
    const auto size = static_cast<int64_t>(b->size) * sign;
    if (b->allocated) {
      delta_.allocation += sign;
      delta_.allocated_bytes += size;
      if (b->size >= max_split_size_) delta_.oversize_allocations += sign;
    }
    if (b->requested != 0) {  // active (see the note above)
      delta_.active += sign;
      delta_.active_bytes += size;
      delta_.requested_bytes += static_cast<int64_t>(b->requested) * sign;
    } else if (!b->allocated && b->mapped && b->is_split() && !b->segment->expandable) {
      delta_.inactive_split += sign;
      delta_.inactive_split_bytes += size;
    }
  }

  Stats& stats_;
  PoolKind kind_;
  size_t max_split_size_;
  Footprint delta_;
};

}  // namespace amem
