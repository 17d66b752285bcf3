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
// The mechanisms it composes are classes of their own, each with its own
// tests; the allocator decides when each one acts:
//
//   PoolSet            the shared and private pools, which serves a request (pool_set.h)
//   SegmentList        segments and their blocks, split and merged (segment_list.h, merge.h)
//   Ledger             every counter's change (accounting.h)
//   EventQueue         frees waiting on other streams' events (event_queue.h)
//   CrossStreamReuse   free blocks serving other streams (cross_stream_reuse.h)
//   ExpandableSegments pages mapped and unmapped in reserved ranges (expandable.h)
//   PageReclaim        idle pages given back before a segment grows (page_reclaim.h)
//   SegmentEvents      segment events to the trace and a replay's log (segment_events.h)
//   DeviceLimit        the memory fraction, an adaptor over the backend that
//                      every backend call goes through (device_limit.h)
//
// Data flows down: the allocator calls the mechanisms, they call the
// backend through DeviceLimit; none calls back up.
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
#include "expandable.h"
#include "options.h"
#include "page_reclaim.h"
#include "pool_set.h"
#include "segment_events.h"
#include "segment_list.h"
#include "stats.h"
#include "trace.h"

namespace amem {

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

  // Expandable segments (expandable.h) grow for the request, after page reclaim (page_reclaim.h).
  Block* allocate_expandable(BlockPool& pool, StreamId stream, size_t rounded);
  void reclaim_idle_pages(size_t wanted);

  // ------------------------------------------------------------ free path
  void mark_freed(uintptr_t address, Block* block);  // allocated -> freed (still active)
  void free_used_elsewhere(Block* block);  // free() of a block other streams used
  void free_block(Block* block);
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
  void synchronize_device();  // before unmapping: nothing may still use the pages
  void garbage_collect_cached_blocks();

  // ------------------------------------------------------------ helpers
  bool capturing() const { return pools_.capturing(); }  // Note [private pools]
  void release_freeable_private_pools();
  void drop_failed_captures();
  void insert_deferred_events();
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
  SegmentEvents segment_events_{trace_};              // segment events: the trace and a replay's log
  ExpandableSegments expandable_{device_, segments_, stats_, options_, cross_, segment_events_};
  PageReclaim reclaim_{expandable_, pools_, stats_, options_};  // idle pages unmapped before growing
  uint64_t clock_ = 0;                                // malloc calls (page_reclaim_age)
  uint64_t alloc_seq_ = 0;
};

}  // namespace amem
