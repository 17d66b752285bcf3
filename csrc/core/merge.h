// merge.h — a free block absorbs its free neighbour: the one merge.
//
// Design note
// -----------
// Blocks of a segment that are available (neither allocated nor waiting on
// events) and alike (both mapped, or both unmapped pages of an expandable
// segment) never sit side by side: whoever makes a block available merges it
// with its neighbours (torch: try_merge_blocks). That happens where a block
// is freed (the allocator's free_block), where pages are mapped next to free
// mapped blocks and where unmapped pages meet unmapped neighbours (the
// expandable segments' map_block and unmap_block): all three call this.
//
// The merge keeps everything the two blocks were part of true at once: the
// segment's links (SegmentList::absorb), the pool's indexes (Note [index
// hand-over] in block.h: a mapped `dst` that is not indexed yet takes `src`'s
// entry), the fences of both (cross-stream reuse), the later idle time, and
// the ledger, which forgets `src`; the caller accounts for `dst`. Inline, so
// that in free_block, on the hot pair, the ledger's deltas stay in registers.
#pragma once

#include <algorithm>
#include <cstddef>

#include "accounting.h"
#include "block.h"
#include "cross_stream_reuse.h"
#include "segment_list.h"

namespace amem {

// Absorbs `src` into `dst`; returns the bytes absorbed (0 when `src` is absent,
// not available, or mapped where `dst` is not, or the reverse).
AMEM_INLINE size_t merge_free_neighbour(Block* dst, Block* src, BlockPool& pool, Ledger& books,
                                        SegmentList& segments) {
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
  segments.recycle(src);
  return subsumed;
}

}  // namespace amem
