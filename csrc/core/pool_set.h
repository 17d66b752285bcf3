// pool_set.h — the pools of one device, and which one serves a request.
//
// Design note
// -----------
// A pool (BlockPool, block.h) is a free index over the blocks of its own
// segments: a block is only ever reused by a request of its pool. PoolSet owns
// every pool of an allocator:
//
//   - the shared pools, small and large, which serve every request by default
//     (with the small_pool option off, every size goes to the large pool);
//   - the private pools, a small and a large one per owner id (a CUDA graph,
//     a MemPool), created when an allocate-to-pool scope first names the id
//     (Note [private pools]);
//   - the open allocate-to-pool scopes (routes), which send the requests on
//     the streams their filter takes to their private pool.
//
// It answers "which pool serves a request of this rounded size on this
// stream" (serving), and keeps the bookkeeping of scopes and owners: opening
// and closing scopes, closing those of failed captures, counting an owner's
// users until it is done with its pool. It decides nothing about memory:
// when cached memory goes back, events, and what a capture forbids are the
// allocator's policy (caching_allocator.h, private_pools.cpp).
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
// synchronized, so, as torch does, the allocator skips event processing and
// never releases cached memory to retry, and a free of a block used on other
// streams records its events only when the last scope ends.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "block.h"
#include "size_policy.h"

namespace amem {

class PoolSet {
 public:
  explicit PoolSet(bool small_pool) : small_pool_(small_pool) {}
  PoolSet(const PoolSet&) = delete;
  PoolSet& operator=(const PoolSet&) = delete;

  // ------------------------------------------------------------ serving requests
  // The pool kind for a rounded request (size_policy.h; large only without a small pool).
  PoolKind kind_for(size_t rounded) const { return small_pool_ ? pool_for(rounded) : PoolKind::kLarge; }
  // The pool that serves a request of `kind` on `stream`: the first open
  // scope whose filter takes the stream (which then counts as served by it),
  // else the shared pool.
  BlockPool& serving(PoolKind kind, StreamId stream) { return capturing() ? routed(kind, stream) : shared(kind); }
  BlockPool& shared(PoolKind kind) { return kind == PoolKind::kSmall ? small_ : large_; }
  const BlockPool& shared(PoolKind kind) const { return kind == PoolKind::kSmall ? small_ : large_; }

  // ------------------------------------------------------------ scopes (Note [private pools])
  // Whether an allocate-to-pool scope is open.
  bool capturing() const { return !routes_.empty(); }
  // Opens a scope for pool `id` (created on first use; one more user).
  void open_scope(PoolId id, std::function<bool(StreamId)> filter);
  // Closes the first open scope of `id`; true when that closed the last scope.
  bool close_scope(PoolId id);
  // Closes the scopes of captures that are over (Note [failed capture]); true
  // when that closed the last scope.
  bool drop_failed_captures();

  // ------------------------------------------------------------ owners (Note [lazy pool release])
  // The owner of `id` is done with it (one user fewer); unknown ids are ignored.
  void release(PoolId id);
  // The private pools that no owner uses any more, in id order.
  std::vector<PoolId> freeable() const;
  BlockPool& private_pool(PoolId id, PoolKind kind);
  // Forgets a private pool (its segments must be gone).
  void erase(PoolId id) { private_.erase(id); }
  bool has_private(PoolId id) const { return private_.count(id) == 1; }
  size_t private_count() const { return private_.size(); }

  // Every pool: the shared ones first, then the private ones in id order.
  std::vector<const BlockPool*> all() const;
  // Whether every private pool carries its own id (the walker's check).
  bool ids_are_true() const;

 private:
  BlockPool& routed(PoolKind kind, StreamId stream);

  struct PrivatePool {
    explicit PrivatePool(PoolId id) : small(PoolKind::kSmall, id), large(PoolKind::kLarge, id) {}
    BlockPool small, large;
    int users = 0;  // open_scope calls not yet matched by release
  };
  struct Route {                          // an open allocate-to-pool scope
    PoolId id;                            // the private pool it sends requests to
    std::function<bool(StreamId)> filter; // the streams it takes
    std::vector<StreamId> served;         // streams it took (Note [failed capture])
  };

  bool small_pool_;                                          // false: one pool for every size (option small_pool)
  BlockPool small_{PoolKind::kSmall};                        // shared: requests up to kSmallSize
  BlockPool large_{PoolKind::kLarge};                        // shared: larger requests (all, without a small pool)
  std::map<PoolId, std::unique_ptr<PrivatePool>> private_;   // by owner id
  std::vector<Route> routes_;                                // open scopes, oldest first
};

}  // namespace amem
