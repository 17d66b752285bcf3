// expandable.h — expandable segments (torch's expandable_segments:True).
//
// Note [expandable segments]
// --------------------------
// Instead of one backend allocation per segment, a pool reserves one large
// range of addresses per stream (9/8 of the device's memory, as torch does)
// and backs it with memory page by page: 2 MiB pages for the small pool and
// 20 MiB pages for the large pool. The blocks of such a segment tile the whole
// range; unmapped blocks sit in the pool's `unmapped` index ordered by
// address, mapped free blocks in the ordinary free index. A request that no
// cached block serves maps the lowest run of available pages that fits
// (find_expandable_block), and empty_cache unmaps the whole free pages
// (unmap_block) and returns a range once nothing in it is mapped.
//
// amem's options change how pages are laid out and mapped: large_page_mb sets
// the large pool's page (2 MiB, the driver's usual granularity, maps what a
// request needs instead of up to 20 MiB more), fine_pages_mb maps the front of
// a segment in 2 MiB pages (Note [fine pages], expandable.cpp) and map_ahead
// maps room for steady growth (Note [map ahead], expandable.cpp). Unmapping
// idle pages while the segment is in use is page reclaim's (page_reclaim.h).
//
// Accounting follows torch (docs/torch_policy.md §6): reserved bytes grow and
// shrink by the pages mapped; each map is one device allocation and each unmap
// one device free; segment and inactive_split counts ignore these segments;
// they are never split by max_split_size rules (any remainder ≥ 512 B splits).
//
// ExpandableSegments is this mechanism: it finds, reserves, maps, unmaps and
// releases, through the device (under the memory fraction), keeping the
// segments, the pools' indexes and the ledger true. What it does not decide
// is the allocator's: whether a request may grow a segment at all (the memory
// fraction, and never for a private pool), when to reclaim, and that the
// device is synchronized before any unmap. Called under the allocator's lock.
#pragma once

#include <cstddef>

#include "block.h"
#include "cross_stream_reuse.h"
#include "device_limit.h"
#include "options.h"
#include "page_layout.h"
#include "segment_events.h"
#include "segment_list.h"
#include "stats.h"

namespace amem {

class ExpandableSegments {
 public:
  ExpandableSegments(DeviceLimit& device, SegmentList& segments, Stats& stats, const Options& options,
                     CrossStreamReuse& cross, SegmentEvents& events)
      : device_(device), segments_(segments), stats_(stats), options_(options), cross_(cross), events_(events) {}
  ExpandableSegments(const ExpandableSegments&) = delete;
  ExpandableSegments& operator=(const ExpandableSegments&) = delete;

  // A free mapped block of at least `rounded` bytes on `stream`, taken out of
  // `pool`; nullptr when the device is out of memory or addresses
  // (torch: try_allocate_expandable_block).
  Block* allocate(BlockPool& pool, StreamId stream, size_t rounded);
  // Unmaps the whole pages inside the free `block`, and gives the range back
  // once nothing in it is mapped; the device must be synchronized (torch: unmap_block).
  void unmap_block(Block* block);
  // Where the pages of `kind`'s segments begin and end (Note [fine pages]).
  PageLayout page_layout(PoolKind kind) const {
    if (kind == PoolKind::kSmall || options_.fine_pages_size == 0) return PageLayout{page_size(kind)};
    return PageLayout{page_size(kind), options_.fine_pages_size, kSmallBuffer};
  }

 private:
  Block* find_expandable_block(BlockPool& pool, StreamId stream, size_t size);
  Block* reserve_segment(BlockPool& pool, StreamId stream, size_t size);
  Block* map_run(Block* start, size_t size);
  bool grows_mapped_end(const Block* start, size_t rounded) const;
  size_t map_ahead_bytes(const Block* start, size_t rounded) const;  // Note [map ahead]
  bool map_block(Block* block, size_t size);
  void release_segment(Block* block);
  size_t page_size(PoolKind kind) const { return kind == PoolKind::kSmall ? kSmallBuffer : options_.large_page_size; }

  DeviceLimit& device_;      // the backend, under the memory fraction
  SegmentList& segments_;    // every segment and its blocks
  Stats& stats_;             // changed through a Ledger only
  const Options& options_;
  CrossStreamReuse& cross_;  // which mapped free blocks a stream may take
  SegmentEvents& events_;    // segment_map / segment_unmap
};

}  // namespace amem
