// expandable.cpp — expandable segments: finding room, mapping ahead, mapping
// and unmapping pages (Note [expandable segments] in expandable.h).
#include "expandable.h"

#include <algorithm>

#include "accounting.h"
#include "merge.h"

namespace amem {
namespace {

constexpr size_t kMaxExpandableSpan = size_t{1} << 44;  // bytes (16 TiB) of addresses per segment

}  // namespace

// Note [fine pages]: with fine_pages_mb, a large-pool segment's first
// fine_pages_mb are mapped in 2 MiB pages and the rest in large_page_mb pages
// (page_layout.h), so the page grows with the segment: a small program's one
// segment rounds its growth to 2 MiB, as torch's small pool does, and a large
// one maps large pages (few device calls, few physical allocations on a GPU).
// The layout is fixed by the offset alone and handed to the backend when the
// range is reserved, so the core's maps and unmaps and the driver's physical
// pages agree on every boundary.

// ================================================================ finding room

// The block to start mapping from: the lowest run of available blocks (mapped
// or not) on `stream` that adds up to `size`; else a new segment's single
// unmapped block; nullptr when no address space is left (torch: find_expandable_block).
Block* ExpandableSegments::find_expandable_block(BlockPool& pool, StreamId stream, size_t size) {
  Block key;
  key.stream = stream;
  for (auto it = pool.unmapped.lower_bound(&key); it != pool.unmapped.end() && (*it)->stream == stream; ++it) {
    Block* start = *it;
    auto usable = [&](const Block* b) { return b->is_available() && (!b->mapped || cross_.reusable_by(b, stream)); };
    if (start->prev != nullptr && usable(start->prev)) start = start->prev;
    size_t room = 0;
    for (Block* b = start; b != nullptr && usable(b) && room < size; b = b->next) room += b->size;
    if (room >= size) return start;
  }
  return reserve_segment(pool, stream, size);
}

Block* ExpandableSegments::reserve_segment(BlockPool& pool, StreamId stream, size_t size) {
  size_t total = std::min(device_.memory_info().total_bytes, kMaxExpandableSpan);
  // torch reserves 9/8 of the device; holes that page reclaim unmapped keep their
  // addresses while the segment grows past them, so with reclaim: twice the device.
  size_t addresses = options_.page_reclaim_age >= 0 ? 2 * total : total + total / 8;
  const PageLayout layout = page_layout(pool.kind);
  size_t span = layout.ceil(std::max(addresses, layout.fine_bytes));
  if (span < size) return nullptr;
  uintptr_t address = device_.reserve_address_range(span, layout);
  if (address == 0) return nullptr;
  Block* block = segments_.create(pool, stream, address, span, true);
  block->mapped = false;
  pool.unmapped.insert(block);
  return block;
}

// Maps the lowest run with room, and room ahead where the growth is steady
// (Note [map ahead]); the mapped block leaves the pool's index for the caller.
Block* ExpandableSegments::allocate(BlockPool& pool, StreamId stream, size_t rounded) {
  Block* c = find_expandable_block(pool, stream, rounded);
  if (c == nullptr) return nullptr;
  const bool grows_end = grows_mapped_end(c, rounded);
  const size_t ahead = grows_end ? map_ahead_bytes(c, rounded) : 0;
  Block* mapped = ahead > 0 ? map_run(c, rounded + ahead) : nullptr;
  if (mapped == nullptr && ahead > 0) c = find_expandable_block(pool, stream, rounded);  // out of memory ahead: exactly
  if (mapped == nullptr) mapped = map_run(c, rounded);
  if (mapped == nullptr) return nullptr;
  if (grows_end) mapped->segment->last_growth = rounded;
  pool.erase(mapped);
  return mapped;
}

// Maps the run of available blocks from `start` until its first block holds
// `size` bytes: the merged block, or nullptr when the device is out of memory.
Block* ExpandableSegments::map_run(Block* start, size_t size) {
  Block* c = start;
  if (!c->mapped && !map_block(c, std::min(c->size, size))) return nullptr;
  while (c->size < size) {
    Block* next = c->next;  // unmapped: find_expandable_block saw enough room
    if (!map_block(next, std::min(size - c->size, next->size))) return nullptr;
    c = next;  // map_block merged c into next
  }
  return c;
}

// ================================================================ mapping ahead

// Note [map ahead]: with map_ahead:N, a request that grows a large-pool
// segment's mapped end inside its fine part (Note [fine pages]), by the same
// rounded size as the growth before it, maps room for N more such requests at
// once. A small program grows by many equal tensors (an MLP's 4 MiB weights,
// their gradients, their optimizer state): in 2 MiB pages each one crossed the
// mapped end and mapped once, where torch's 20 MiB pages cover five. The room
// is a free mapped block at the segment's end that the next requests take; it
// costs peak reserved only where the growth stops inside it, so it is bounded:
// at most one large page, never past the fine part, and only for requests
// under 10 MiB (torch serves those from its 20 MiB segments and rounds larger
// ones to 2 MiB alone; repeated 32 MiB requests mapping ahead cost predicted
// programs 10% of their peak, docs/policies.md). Growth of other sizes maps
// exactly, as before, so a program whose peak depends on 2 MiB rounding of
// varied tensors (the demo's GPT) keeps it. If the device cannot back the
// room, the request maps exactly.

// Whether serving `rounded` from the run at `start` maps the segment's last
// block (its unmapped end): the run is that block, or a free mapped block too
// small alone followed by it.
bool ExpandableSegments::grows_mapped_end(const Block* start, size_t rounded) const {
  const Block* end = start->mapped ? start->next : start;
  if (start->mapped && start->size >= rounded) return false;
  return end != nullptr && !end->mapped && end->next == nullptr;
}

// The bytes to map beyond `rounded` for a request growing the mapped end from `start`.
size_t ExpandableSegments::map_ahead_bytes(const Block* start, size_t rounded) const {
  const Segment* seg = start->segment;
  // Only requests that torch serves from its 20 MiB segments: larger ones it rounds to 2 MiB alone.
  if (options_.map_ahead == 0 || seg->last_growth != rounded || rounded >= kMinLargeAlloc) return 0;
  const size_t fine_end = page_layout(seg->kind).fine_bytes;  // 0 for the small pool
  const size_t request_end = start->address - seg->address + rounded;
  if (request_end >= fine_end) return 0;
  if (device_.capped()) return 0;  // under a memory fraction every byte counts: map exactly
  const size_t ahead = std::min(options_.map_ahead * rounded, page_size(seg->kind));  // at most one large page
  return std::min(ahead, fine_end - request_end);
}

// ================================================================ mapping

// Maps whole pages at the front of the unmapped `block`, at least `size`
// bytes; the rest stays unmapped (torch: map_block).
bool ExpandableSegments::map_block(Block* block, size_t size) {
  BlockPool& pool = *block->pool;
  const size_t offset = block->address - block->segment->address;  // a page boundary
  const size_t bytes = std::min(page_layout(pool.kind).ceil(offset + size) - offset, block->size);
  if (!device_.map_pages(block->address, bytes)) return false;
  pool.unmapped.erase(block);
  block->mapped = true;
  if (bytes < block->size) {
    Block* tail = segments_.insert_after(block, block->address + bytes, block->size - bytes);
    tail->mapped = false;
    pool.unmapped.insert(tail);
    block->size = bytes;
  }
  Ledger books(stats_, pool.kind, options_.max_split_size);  // expandable segments' free blocks count nothing: no change to post
  merge_free_neighbour(block, block->prev, pool, books, segments_);
  merge_free_neighbour(block, block->next, pool, books, segments_);
  if (!block->indexed) pool.insert(block);  // else it took a neighbour's entry
  books.pages_mapped(bytes);
  events_.note(TraceAction::k_segment_map, block->address, bytes, block->stream);
  return true;
}

// Unmaps the whole pages inside the free `block`; partial pages at either end
// stay mapped as free blocks (torch: unmap_block).
void ExpandableSegments::unmap_block(Block* block) {
  BlockPool& pool = *block->pool;
  const Segment* seg = block->segment;
  const uintptr_t start = seg->address + page_layout(pool.kind).ceil(block->address - seg->address);
  const uintptr_t end = seg->address + page_layout(pool.kind).floor(block->address + block->size - seg->address);
  if (end <= start) return;
  pool.erase(block);
  if (start > block->address) pool.insert(segments_.insert_before(block, block->address, start - block->address));
  if (end < block->address + block->size) pool.insert(segments_.insert_after(block, end, block->address + block->size - end));
  block->address = start;
  block->size = end - start;
  block->mapped = false;
  device_.unmap_pages(start, end - start);
  Ledger books(stats_, pool.kind, options_.max_split_size);  // as in map_block: nothing to post
  merge_free_neighbour(block, block->prev, pool, books, segments_);
  merge_free_neighbour(block, block->next, pool, books, segments_);
  block->fences.clear();  // the device was synchronized before any unmap
  pool.unmapped.insert(block);
  books.pages_unmapped(end - start);
  events_.note(TraceAction::k_segment_unmap, start, end - start, block->stream);
  if (block->prev == nullptr && block->next == nullptr) release_segment(block);
}

// ================================================================ giving a range back

void ExpandableSegments::release_segment(Block* block) {
  Segment* segment = block->segment;
  device_.release_address_range(segment->address, segment->size);
  block->pool->unmapped.erase(block);
  segments_.destroy(block);
}

}  // namespace amem
