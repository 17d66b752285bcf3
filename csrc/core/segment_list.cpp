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

}  // namespace amem
