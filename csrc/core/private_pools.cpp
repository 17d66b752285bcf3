// private_pools.cpp — the allocator's side of private pools: the scopes torch
// opens and closes, releasing the memory of pools nobody uses, and the frees
// that wait for a capture's end. The pools, scopes and owners themselves are
// the PoolSet's (pool_set.h: Note [private pools], [lazy pool release],
// [failed capture]).
//
// While a scope is open (capturing()) the device cannot be queried or
// synchronized, so, as torch does, malloc skips event processing and never
// releases cached memory to retry, and a free of a block used on other streams
// records its events only when the last scope ends (deferred_).
#include "caching_allocator.h"

#include <stdexcept>

namespace amem {

void CachingAllocator::begin_allocate_to_pool(PoolId id, std::function<bool(StreamId)> filter) {
  if (id == kDefaultPool) throw std::invalid_argument("amem: pool id (0, 0) is the shared pool, not a private one");
  Guard guard(*this);
  pools_.open_scope(id, std::move(filter));
}

void CachingAllocator::end_allocate_to_pool(PoolId id) {
  Guard guard(*this);
  if (pools_.close_scope(id)) insert_deferred_events();
}

void CachingAllocator::release_pool(PoolId id) {
  Guard guard(*this);
  pools_.release(id);
}

size_t CachingAllocator::private_pool_count() const {
  Guard guard(*this);
  return pools_.private_count();
}

// Pools nobody uses any more give back their cached segments; a pool with no
// segments left is deleted (torch: release_cached_blocks over graph_pools_freeable).
void CachingAllocator::release_freeable_private_pools() {
  for (PoolId id : pools_.freeable()) {
    release_pool_segments(pools_.private_pool(id, PoolKind::kLarge));
    release_pool_segments(pools_.private_pool(id, PoolKind::kSmall));
    bool has_segments = false;
    for (const auto& [address, seg] : segments_.all()) has_segments |= seg->first->pool->owner == id;
    if (!has_segments) pools_.erase(id);
  }
}

// Closes the scopes of captures that are over (Note [failed capture]); when
// that ends the last one, the frees deferred during capture record their events.
void CachingAllocator::drop_failed_captures() {
  if (pools_.drop_failed_captures()) insert_deferred_events();
}

// The frees deferred during capture record their events (Note [record_stream]).
// One block at a time, so a device error leaves the rest deferred, intact.
void CachingAllocator::insert_deferred_events() {
  while (!deferred_.empty()) {
    Block* b = deferred_.back();
    StreamEvents events = record_stream_events(b);  // may throw: b stays deferred
    deferred_.pop_back();
    b->pending_events -= 1;  // the token that kept it pending during capture
    insert_events(b, std::move(events));
    if (b->pending_events == 0) free_block(b);
  }
}

}  // namespace amem
