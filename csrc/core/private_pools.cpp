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
// graph is destroyed torch calls release_pool.
//
// Note [lazy pool release]: torch calls release_pool *before* it destroys the
// graph's executable, without synchronizing, so a replay of the graph may
// still be running on the device. release_pool therefore gives nothing back:
// it only marks the pool freeable (no users left). Its cached segments go back
// at the next release of cached memory (empty_cache, or an out-of-memory
// retry), as the native allocator does (graph_pools_freeable), and the pool
// itself once its last block has been freed and released.
//
// A private pool never uses expandable segments, whatever the option says:
// torch's native allocator gives them plain segments only, so a capture never
// maps pages (a virtual memory call) and no pool reserves its own range of
// addresses the size of the device per stream.
//
// Note [failed capture]: when cudaStreamEndCapture fails, torch never calls
// end_allocate_to_pool (CUDAGraph::capture_end throws first), so the scope
// would stay open for ever: events never processed, no cache released on an
// out-of-memory. torch's filter takes a stream only while that stream is
// capturing, so a scope that has served streams and whose filter now takes
// none of them belongs to a capture that is over: drop_failed_captures closes
// it (before malloc and empty_cache look at capturing()). A scope that never
// served a stream costs nothing but keeps capturing() true until it ends.
//
// While a scope is open (capturing()) the device cannot be queried or
// synchronized, so, as torch does, malloc skips event processing and never
// releases cached memory to retry, and a free of a block used on other streams
// records its events only when the last scope ends (deferred_).
#include "caching_allocator.h"

#include <algorithm>

namespace amem {

void CachingAllocator::begin_allocate_to_pool(PoolId id, std::function<bool(StreamId)> filter) {
  if (id == kDefaultPool) throw std::invalid_argument("amem: pool id (0, 0) is the shared pool, not a private one");
  Guard guard(*this);
  auto& pool = private_pools_[id];
  if (!pool) pool = std::make_unique<PrivatePool>(id);
  pool->users += 1;
  routes_.push_back(Route{id, std::move(filter), {}});
}

void CachingAllocator::end_allocate_to_pool(PoolId id) {
  Guard guard(*this);
  for (auto it = routes_.begin(); it != routes_.end(); ++it) {
    if (it->id != id) continue;
    routes_.erase(it);
    if (routes_.empty()) insert_deferred_events();
    return;
  }
}

void CachingAllocator::release_pool(PoolId id) {
  Guard guard(*this);
  auto it = private_pools_.find(id);
  if (it == private_pools_.end()) return;  // never used, or already gone
  if (it->second->users > 0) it->second->users -= 1;  // at 0, freeable: Note [lazy pool release]
}

size_t CachingAllocator::private_pool_count() const {
  Guard guard(*this);
  return private_pools_.size();
}

// The pool a request is served from: the first open scope whose filter takes
// the stream, else the shared pools.
BlockPool& CachingAllocator::pool_for_request(PoolKind kind, StreamId stream) {
  for (Route& route : routes_) {
    if (!route.filter(stream)) continue;
    if (std::find(route.served.begin(), route.served.end(), stream) == route.served.end())
      route.served.push_back(stream);
    PrivatePool& p = *private_pools_.at(route.id);
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

// One block at a time, so a device error leaves the rest deferred, intact.
// Closes the scopes of captures that are over (Note [failed capture]).
void CachingAllocator::drop_failed_captures() {
  auto over = [](Route& r) {
    return !r.served.empty() && std::none_of(r.served.begin(), r.served.end(), r.filter);
  };
  const size_t before = routes_.size();
  routes_.erase(std::remove_if(routes_.begin(), routes_.end(), over), routes_.end());
  if (before != routes_.size() && routes_.empty()) insert_deferred_events();
}

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
