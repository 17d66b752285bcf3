// segment_list.cpp — segments and their blocks (see segment_list.h).
#include "segment_list.h"

namespace amem {

SegmentList::~SegmentList() {
  for (auto& [address, segment] : segments_) {
    for (Block* b = segment->first; b != nullptr;) {
      Block* next = b->next;
      delete b;
      b = next;
    }
    delete segment;
  }
  for (Block* b : spare_) delete b;
}

// ================================================================ segments

Block* SegmentList::create(BlockPool& pool, StreamId stream, uintptr_t address, size_t size, bool expandable) {
  auto* segment = new Segment{address, size, stream, pool.kind, nullptr, expandable};
  Block* block = new_block();
  block->address = address;
  block->size = size;
  block->stream = stream;
  block->segment = segment;
  block->pool = &pool;
  segment->first = block;
  segments_.emplace(address, segment);
  return block;
}

void SegmentList::destroy(Block* only_block) {
  Segment* segment = only_block->segment;
  segments_.erase(segment->address);
  recycle(only_block);
  delete segment;
}

const Segment* SegmentList::containing(uintptr_t address) const {
  auto it = segments_.upper_bound(address);
  if (it == segments_.begin()) return nullptr;
  const Segment* seg = std::prev(it)->second;
  return address < seg->address + seg->size ? seg : nullptr;
}

// ================================================================ split and merge

// A free block [address, address + size) of the same segment as `of`, not yet linked.
Block* SegmentList::sibling(const Block* of, uintptr_t address, size_t size) {
  Block* b = new_block();
  b->address = address;
  b->size = size;
  b->stream = of->stream;
  b->segment = of->segment;
  b->pool = of->pool;
  return b;
}

Block* SegmentList::insert_after(Block* block, uintptr_t address, size_t size) {
  Block* b = sibling(block, address, size);
  b->prev = block;
  b->next = block->next;
  if (b->next) b->next->prev = b;
  block->next = b;
  return b;
}

Block* SegmentList::insert_before(Block* block, uintptr_t address, size_t size) {
  Block* b = sibling(block, address, size);
  b->next = block;
  b->prev = block->prev;
  if (b->prev) b->prev->next = b;
  else block->segment->first = b;
  block->prev = b;
  return b;
}

void SegmentList::absorb(Block* dst, Block* src) {
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

// ================================================================ block objects

Block* SegmentList::new_block() {
  if (spare_.empty()) return new Block();
  Block* b = spare_.back();
  spare_.pop_back();
  return b;
}

void SegmentList::recycle(Block* block) {
  *block = Block();
  spare_.push_back(block);
}

}  // namespace amem
