// caching_allocator.h — one device's caching allocator: the policy core.
//
// Design note
// -----------
// CachingAllocator decides which bytes serve a request, with PyTorch's native
// policy by default (see size_policy.h for the size classes):
//
//   malloc(size, stream)
//     1. size 0 returns address 0 and changes nothing (Note [size 0]).
//     2. Complete blocks whose stream events have finished (record_stream).
//     3. Round the request; the pool set picks the pool that serves it (the
//        small or large shared pool, or a private one: pool_set.h).
//     4. Best fit: the smallest cached block of the same stream that is large
//        enough, O(log n) in the pool's (stream, size, address) index.
//     5. Otherwise ask the backend for a new segment (after the optional
//        garbage collection); if that fails, free oversize cached blocks and
//        retry; if that fails, free every cached whole segment and retry once
//        more; if that fails, the request is out of memory.
//     6. Split the block if the remainder is worth keeping (should_split).
//   free(address)
//     The block becomes free — or pending, if other streams used it, until
//     their events complete — and merges with free neighbours.
//   empty_cache()
//     Returns every cached whole segment to the backend.
//
// The mechanisms it composes have their own types: the pools (PoolSet,
// pool_set.h), segments and their blocks with split and merge (SegmentList,
// segment_list.h), the counters' transitions (Ledger, accounting.h), frees
// waiting on events (EventQueue, event_queue.h), cross-stream reuse
// (CrossStreamReuse, cross_stream_reuse.h) and the memory fraction (DeviceLimit,
// device_limit.h: an adaptor over the backend that every backend call goes
// through).
//
// Lock contract: every public member takes lock_ through a Guard; every
// private member expects it held and never takes it. The backend is only
// called under the lock. Nothing here knows about torch or CUDA.
//
// Note [size 0]: torch asks the plugin for 0 bytes for empty tensors. Like the
// native allocator we return a null pointer without touching any state, and
// free(0) is a no-op, so empty tensors cost nothing and are never "leaked".
//
// Note [record_stream]: a block used on another stream (record_stream) is not
// reusable when its owner frees it: we record an event on each such stream and
// keep the block "pending" (active, not allocated) until every event has
// completed, exactly as the native allocator does.
//
// Note [fragmentation at the peak]: when reserved memory reaches a new peak we
// start recording the allocated bytes, and keep the highest allocated figure
// seen while reserved stays at that peak. 1 - that / peak reserved is the
// fragmentation at the peak: how much of the most memory we ever held was not
// serving a tensor when it mattered.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "accounting.h"
#include "address_map.h"
#include "allocator_lock.h"
#include "backend.h"
#include "block.h"
#include "cross_stream_reuse.h"
#include "device_limit.h"
#include "errors.h"
#include "event_queue.h"
#include "options.h"
#include "pool_set.h"
#include "segment_list.h"
#include "stats.h"
#include "trace.h"

namespace amem {

// A segment event (segment_alloc/free, segment_map/unmap) for a replay's log.
struct SegmentEvent {
  TraceAction action = TraceAction::k_segment_alloc;
  uint64_t bytes = 0;
  uint64_t op = 0;  // set by the replay loop: the request that caused it
};

struct ValidationTally;   // validate.cpp
struct ValidationCounts;  // validate.cpp

class CachingAllocator {
 public:
  CachingAllocator(std::unique_ptr<Backend> backend, Options options);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // ------------------------------------------------------------ requests
  uintptr_t malloc(size_t size, StreamId stream);   // throws OutOfMemoryError
  void free(uintptr_t address);                      // throws InvalidFreeError
  void record_stream(uintptr_t address, StreamId stream);
  void empty_cache();
  // Caps reserved memory at fraction × the backend's total (torch semantics).
  void set_memory_fraction(double fraction);

  // ------------------------------------------------------------ private pools (private_pools.cpp)
  // Note [private pools]: while a scope is open, requests on streams that pass
  // `filter` are served from pool `id` only (torch: beginAllocateToPool, used by
  // CUDA graph capture and MemPool).
  void begin_allocate_to_pool(PoolId id, std::function<bool(StreamId)> filter);
  void end_allocate_to_pool(PoolId id);
  // The pool's owner is done with it: its cached memory goes back at the next
  // empty_cache or out-of-memory retry (Note [lazy pool release]), and the pool
  // disappears once its last block is freed and released.
  void release_pool(PoolId id);
  size_t private_pool_count() const;

  // ------------------------------------------------------------ introspection
  std::string stats_json() const;
  std::string segments_json() const;
  std::string fragmentation_json() const;
  void reset_peak_stats();
  void reset_accumulated_stats();
  // Throws std::logic_error naming the first broken invariant.
  void check_valid() const;
  // The allocated block containing `address`: {block address, block size,
  // requested}; all zero if none.
  struct BlockInfo {
    uintptr_t address = 0;
    size_t size = 0;
    size_t requested = 0;
    StreamId stream = 0;
    uint64_t alloc_seq = 0;
  };
  BlockInfo block_info(uintptr_t address) const;
  // Allocated and reserved bytes now, cheaply (for replay timelines).
  struct Figures {
    int64_t allocated = 0;
    int64_t reserved = 0;
  };
  Figures figures() const;

  // ------------------------------------------------------------ recording (trace.h)
  void start_trace(size_t max_entries);
  void stop_trace();
  void clear_trace();
  bool tracing() const;
  std::string trace_json() const;

  // While set, every segment event is also appended to `log` (the replay loop's
  // fidelity record); nullptr stops it. The log must outlive the setting.
  void set_segment_log(std::vector<SegmentEvent>* log);

  const Options& options() const { return options_; }
  const char* backend_name() const { return device_.name(); }
  Backend& backend() { return *backend_; }  // the device's own, below the memory fraction

 private:
  // ------------------------------------------------------------ malloc path
  Block* find_free_block(BlockPool& pool, StreamId stream, size_t rounded);
  Block* obtain_segment_block(BlockPool& pool, StreamId stream, size_t rounded);
  Block* allocate_segment(BlockPool& pool, StreamId stream, size_t rounded, bool is_retry);
  Block* split_and_mark_allocated(Block* block, size_t rounded, size_t requested, StreamId stream);
  [[noreturn]] void fail_out_of_memory(size_t size, size_t rounded, StreamId stream);

  // ------------------------------------------------------------ expandable segments (expandable.cpp)
  Block* allocate_expandable(BlockPool& pool, StreamId stream, size_t rounded);
  Block* find_expandable_block(BlockPool& pool, StreamId stream, size_t size);
  Block* reserve_expandable_segment(BlockPool& pool, StreamId stream, size_t size);
  Block* map_run(Block* start, size_t size);
  bool grows_mapped_end(const Block* start, size_t rounded) const;
  size_t map_ahead_bytes(const Block* start, size_t rounded) const;  // Note [map ahead]
  bool map_block(Block* block, size_t size);
  void unmap_block(Block* block);
  void release_expandable_segment(Block* block);
  size_t page_size(PoolKind kind) const { return kind == PoolKind::kSmall ? kSmallBuffer : options_.large_page_size; }
  // Where the pages of `kind`'s expandable segments begin and end (Note [fine pages]).
  PageLayout page_layout(PoolKind kind) const {
    if (kind == PoolKind::kSmall || options_.fine_pages_size == 0) return PageLayout{page_size(kind)};
    return PageLayout{page_size(kind), options_.fine_pages_size, kSmallBuffer};
  }
  void reclaim_idle_pages(size_t wanted);
  std::vector<Block*> idle_pages(size_t min_bytes) const;

  // ------------------------------------------------------------ free path
  void mark_freed(uintptr_t address, Block* block);  // allocated -> freed (still active)
  void free_used_elsewhere(Block* block);  // free() of a block other streams used
  void free_block(Block* block);
  size_t merge_into(Block* dst, Block* src, BlockPool& pool, Ledger& ledger);  // inline, below
  using StreamEvents = std::vector<std::pair<StreamId, EventId>>;
  StreamEvents record_stream_events(const Block* block);  // all or nothing
  void insert_events(Block* block, StreamEvents events);
  void process_events();
  void synchronize_and_free_events();

  // ------------------------------------------------------------ releasing memory
  bool release_available_cached_blocks(BlockPool& pool, StreamId stream, size_t rounded);
  bool release_cached_blocks();
  void release_pool_segments(BlockPool& pool);
  void release_segment_of(Block* block);
  void garbage_collect_cached_blocks();

  // ------------------------------------------------------------ helpers
  bool capturing() const { return pools_.capturing(); }  // Note [private pools]
  void release_freeable_private_pools();
  void drop_failed_captures();
  void insert_deferred_events();
  void note_segment_event(TraceAction action, uintptr_t address, size_t bytes, StreamId stream);
  Ledger ledger(PoolKind kind) { return Ledger(stats_, kind, options_.max_split_size); }
  Block* find_block_at(uintptr_t address) const;
  // Why `address` is not a live allocation, for an error about `operation`.
  std::string describe_bad_pointer(const char* operation, uintptr_t address) const;
  struct FreeSpace {
    size_t total = 0;    // bytes in cached free blocks
    size_t largest = 0;  // the largest of them
  };
  FreeSpace free_space() const;
  void check_valid_locked() const;
  void check_segment(const Segment& seg, ValidationTally& t, ValidationCounts& counts) const;
  void check_block(const Block* b, const Block* prev, bool split, ValidationTally& t, ValidationCounts& counts) const;

  // Every public member holds one for its whole body: the lock, and the end
  // of the call's one trace timestamp (Note [trace time]).
  class Guard {
   public:
    explicit Guard(const CachingAllocator& a) : a_(a) { a_.lock_.lock(); }
    ~Guard() {
      a_.trace_.end_call();
      a_.lock_.unlock();
    }
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

   private:
    const CachingAllocator& a_;
  };

  mutable AllocatorLock lock_;
  std::unique_ptr<Backend> backend_;                  // the device's, owned; called through device_ only
  Options options_;
  Stats stats_;
  Trace trace_;
  DeviceLimit device_{*backend_, stats_.reserved_bytes};  // the backend under the memory fraction
  PoolSet pools_{options_.small_pool};                // shared and private pools, open scopes
  std::vector<Block*> deferred_;  // freed during capture with stream uses: events wait for its end
  AddressMap allocated_;                              // address -> block handed out
  SegmentList segments_;                              // every segment and its blocks
  EventQueue events_{device_};                        // blocks waiting on other streams' events
  CrossStreamReuse cross_{device_, pools_, options_};  // free blocks serving other streams
  uint64_t clock_ = 0;                                // malloc calls (page_reclaim_age)
  int64_t reclaim_unmaps_ = 0;                        // unmaps made by page reclaim (its budget)
  std::vector<SegmentEvent>* segment_log_ = nullptr;  // see set_segment_log
  uint64_t alloc_seq_ = 0;
};

// ================================================================ inline: the hot pair's merge

// Absorbs the free neighbour `src` into `dst`; returns the bytes absorbed
// (0 when `src` is absent or not free) (torch: try_merge_blocks). A mapped
// `dst` that is not yet indexed takes `src`'s entry (Note [index hand-over]).
// The ledger forgets `src`; the caller accounts for `dst`. Inline, so that in
// free_block the ledger's deltas stay in registers.
AMEM_INLINE size_t CachingAllocator::merge_into(Block* dst, Block* src, BlockPool& pool, Ledger& books) {
  if (src == nullptr || !src->is_available() || src->mapped != dst->mapped) return 0;
  books.remove<Shape::kFreePiece>(src);
  SegmentList::absorb(dst, src);
  CrossStreamReuse::absorb_fences(dst, src);
  dst->idle_since = std::max(dst->idle_since, src->idle_since);
  if (!src->mapped) {
    pool.unmapped.erase(src);
  } else if (dst->indexed) {
    pool.erase(src);
    pool.rekey(dst);
  } else if (src->indexed) {
    pool.replace(src, dst);
  }
  const size_t subsumed = src->size;
  segments_.recycle(src);
  return subsumed;
}

}  // namespace amem
