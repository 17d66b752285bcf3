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

// ================================================================ block objects

inline Block* SegmentList::new_block() {
  if (spare_.empty()) return new Block();
  Block* b = spare_.back();
  spare_.pop_back();
  return b;
}

inline void SegmentList::recycle(Block* block) {
  *block = Block();
  spare_.push_back(block);
}

// ================================================================ split and merge (inline: the hot pair splits and merges once each)

// A free block [address, address + size) of the same segment as `of`, not yet linked.
inline Block* SegmentList::sibling(const Block* of, uintptr_t address, size_t size) {
  Block* b = new_block();
  b->address = address;
  b->size = size;
  b->stream = of->stream;
  b->segment = of->segment;
  b->pool = of->pool;
  return b;
}

inline Block* SegmentList::insert_after(Block* block, uintptr_t address, size_t size) {
  Block* b = sibling(block, address, size);
  b->prev = block;
  b->next = block->next;
  if (b->next) b->next->prev = b;
  block->next = b;
  return b;
}

inline Block* SegmentList::insert_before(Block* block, uintptr_t address, size_t size) {
  Block* b = sibling(block, address, size);
  b->next = block;
  b->prev = block->prev;
  if (b->prev) b->prev->next = b;
  else block->segment->first = b;
  block->prev = b;
  return b;
}

inline void SegmentList::absorb(Block* dst, Block* src) {
  if (dst->prev == src) {
    dst->address = src->address;
    dst->prev = src->prev;
    if (dst->prev) dst->prev->next = dst;
    else dst->segment->first = dst;
  } else {
    dst->next = src->next;
    if (dst->next) dst->next->prev = dst;
  }
  dst->size += src->size;
}

}  // namespace amem
