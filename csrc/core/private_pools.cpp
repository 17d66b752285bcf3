// private_pools.cpp — pools that serve one owner only (CUDA graphs, MemPool).
//
// Note [private pools]
// --------------------
// torch captures a CUDA graph by replaying the same addresses every time the
// graph runs, so the memory a capture allocates must stay reserved for that
// graph alone: torch opens an "allocate to pool" scope (begin_allocate_to_pool
// with the pool's id and a stream filter), and every request on a stream that
// passes the filter is served from that pool's own small and large pools, never
// from the shared ones; blocks freed later return to the private pool. When the
// graph is destroyed torch calls release_pool; the pool's cached segments go
// back then, and the pool itself once its last block is freed.
//
// While a scope is open (capturing()) the device cannot be queried or
// synchronized, so, as torch does, malloc skips event processing and never
// releases cached memory to retry, and a free of a block used on other streams
// records its events only when the last scope ends (deferred_).
#include "caching_allocator.h"

namespace amem {

void CachingAllocator::begin_allocate_to_pool(PoolId id, std::function<bool(StreamId)> filter) {
  if (id == kDefaultPool) throw std::invalid_argument("amem: pool id (0, 0) is the shared pool, not a private one");
  Guard guard(*this);
  auto& pool = private_pools_[id];
  if (!pool) pool = std::make_unique<PrivatePool>(id);
  pool->users += 1;
  routes_.emplace_back(id, std::move(filter));
}

void CachingAllocator::end_allocate_to_pool(PoolId id) {
  Guard guard(*this);
  for (auto it = routes_.begin(); it != routes_.end(); ++it) {
    if (it->first != id) continue;
    routes_.erase(it);
    if (routes_.empty()) insert_deferred_events();
    return;
  }
}

void CachingAllocator::release_pool(PoolId id) {
  Guard guard(*this);
  auto it = private_pools_.find(id);
  if (it == private_pools_.end()) return;  // never used, or already gone
  if (--it->second->users > 0) return;
  release_freeable_private_pools();
  if (options_.debug_checks) check_valid_locked();
}

size_t CachingAllocator::private_pool_count() const {
  Guard guard(*this);
  return private_pools_.size();
}

// The pool a request is served from: the first open scope whose filter takes
// the stream, else the shared pools.
BlockPool& CachingAllocator::pool_for_request(PoolKind kind, StreamId stream) {
  for (auto& [id, filter] : routes_) {
    if (!filter(stream)) continue;
    PrivatePool& p = *private_pools_.at(id);
    return kind == PoolKind::kSmall ? p.small : p.large;
  }
  return pool_of(kind);
}

std::vector<const BlockPool*> CachingAllocator::all_pools() const {
  std::vector<const BlockPool*> pools{&small_, &large_};
  for (const auto& [id, p] : private_pools_) pools.insert(pools.end(), {&p->small, &p->large});
  return pools;
}

// Pools nobody uses any more give back their cached segments; a pool with no
// segments left is deleted (torch: release_cached_blocks over graph_pools_freeable).
void CachingAllocator::release_freeable_private_pools() {
  for (auto it = private_pools_.begin(); it != private_pools_.end();) {
    PrivatePool& p = *it->second;
    if (p.users > 0) {
      ++it;
      continue;
    }
    release_pool_segments(p.large);
    release_pool_segments(p.small);
    bool has_segments = false;
    for (const auto& [address, seg] : segments_.all()) has_segments |= seg->first->pool->owner == it->first;
    it = has_segments ? std::next(it) : private_pools_.erase(it);
  }
}

void CachingAllocator::insert_deferred_events() {
  std::vector<Block*> blocks;
  blocks.swap(deferred_);
  for (Block* b : blocks) {
    b->pending_events -= 1;  // the token that kept it pending during capture
    insert_events(b);
    if (b->pending_events == 0) free_block(b);
  }
}

}  // namespace amem
