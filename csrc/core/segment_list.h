// segment_list.h — segments and the blocks that tile them: split and merge.
//
// Design note
// -----------
// A Segment is one piece of memory (or, for an expandable segment, one range
// of addresses) obtained from the backend, tiled without gaps by Blocks linked
// in address order (block.h). SegmentList owns both: it creates a segment with
// its one spanning block, splits a block in two (insert_after/insert_before),
// lets a block absorb its neighbour (merge), and destroys a segment once it is
// one block again. It knows nothing of free indexes, counters or the backend:
// the allocator decides when to split and merge, keeps the pools' indexes and
// the ledger (accounting.h) right, and gives memory back.
//
// Block objects are recycled (spare_), so the steady state of malloc/free
// allocates nothing.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "block.h"

namespace amem {

class SegmentList {
 public:
  using Map = std::map<uintptr_t, Segment*>;

  SegmentList() = default;
  SegmentList(const SegmentList&) = delete;
  SegmentList& operator=(const SegmentList&) = delete;
  ~SegmentList();

  // A segment [address, address + size) and the one free block that spans it
  // (in no index yet).
  Block* create(BlockPool& pool, StreamId stream, uintptr_t address, size_t size, bool expandable);
  // Forgets a segment that is one block again; the block is recycled.
  void destroy(Block* only_block);
  // A new free block [address, address + size) of `block`'s segment, linked
  // right after (or before) it. The caller shrinks `block` to match.
  Block* insert_after(Block* block, uintptr_t address, size_t size);
  Block* insert_before(Block* block, uintptr_t address, size_t size);
  // `dst` takes over the bytes of its neighbour `src`, which is unlinked but
  // not yet recycled (the caller fixes the indexes first).
  static void absorb(Block* dst, Block* src);
  void recycle(Block* block);

  const Map& all() const { return segments_; }
  bool empty() const { return segments_.empty(); }
  // The segment whose range holds `address`, or nullptr.
  const Segment* containing(uintptr_t address) const;

 private:
  Block* new_block();
  Block* sibling(const Block* of, uintptr_t address, size_t size);

  Map segments_;               // by address
  std::vector<Block*> spare_;  // recycled Block objects
};

}  // namespace amem
