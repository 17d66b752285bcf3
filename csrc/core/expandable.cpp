// expandable.cpp — expandable segments (torch's expandable_segments:True).
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
// amem's options change two things: large_page_mb sets the large pool's page
// (2 MiB, the driver's usual granularity, maps what a request needs instead of
// up to 20 MiB more), and page_reclaim_age gives pages back while the segment
// is in use: before mapping new pages, whole free pages idle for that many
// allocator calls are unmapped first, oldest first, at most as many bytes as
// the request maps (reclaim_idle_pages). So physical memory moves to where it
// is needed, across streams and pools, instead of staying mapped in a hole.
// Bounds on device calls: it runs only when the mapping would raise reserved
// memory above its peak, takes only holes of at least half the request, and
// adds at most one unmap per kMapsPerReclaim maps; with page_reclaim_min_mb, only
// requests of at least that size reclaim (the large request that no hole fits:
// a 512 MiB tensor beside a 510 MiB hole, small_train's pattern; smaller ones
// find holes soon after and reclaiming for them raised the peak, as it did
// 2.2% on lm_medium_ctx128_training, docs/policies.md). Unmapping memory the
// device may still use is not allowed, so a reclaim synchronizes once.
//
// Accounting follows torch (docs/torch_policy.md §6): reserved bytes grow and
// shrink by the pages mapped; each map is one device allocation and each unmap
// one device free; segment and inactive_split counts ignore these segments;
// they are never split by max_split_size rules (any remainder ≥ 512 B splits).
#include "caching_allocator.h"

#include <algorithm>

namespace amem {
namespace {

constexpr size_t kReclaimHoleShare = 2;  // reclaim holes of at least 1/this of the request
constexpr int64_t kMapsPerReclaim = 4;  // maps per unmap that page reclaim may add (its bound on device calls)
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
Block* CachingAllocator::find_expandable_block(BlockPool& pool, StreamId stream, size_t size) {
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
  return reserve_expandable_segment(pool, stream, size);
}

Block* CachingAllocator::reserve_expandable_segment(BlockPool& pool, StreamId stream, size_t size) {
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

// A free mapped block of at least `rounded` bytes, taken out of the pool
// (torch: try_allocate_expandable_block).
Block* CachingAllocator::allocate_expandable(BlockPool& pool, StreamId stream, size_t rounded) {
  const int64_t reserved = stats_.reserved_bytes.current();
  if (!device_.admits(segment_size_for(rounded))) return nullptr;  // as a plain segment would (device_limit.h)
  if (options_.page_reclaim_age >= 0 && rounded >= options_.page_reclaim_min_size && !capturing() &&
      reserved + static_cast<int64_t>(rounded) > stats_.reserved_bytes.peak())  // only to keep the peak down
    reclaim_idle_pages(rounded);
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
Block* CachingAllocator::map_run(Block* start, size_t size) {
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
bool CachingAllocator::grows_mapped_end(const Block* start, size_t rounded) const {
  const Block* end = start->mapped ? start->next : start;
  if (start->mapped && start->size >= rounded) return false;
  return end != nullptr && !end->mapped && end->next == nullptr;
}

// The bytes to map beyond `rounded` for a request growing the mapped end from `start`.
size_t CachingAllocator::map_ahead_bytes(const Block* start, size_t rounded) const {
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
bool CachingAllocator::map_block(Block* block, size_t size) {
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
  Ledger books = ledger(pool.kind);  // expandable segments' free blocks count nothing: no change to post
  merge_into(block, block->prev, pool, books);
  merge_into(block, block->next, pool, books);
  if (!block->indexed) pool.insert(block);  // else it took a neighbour's entry
  books.pages_mapped(bytes);
  note_segment_event(TraceAction::k_segment_map, block->address, bytes, block->stream);
  return true;
}

// Unmaps the whole pages inside the free `block`; partial pages at either end
// stay mapped as free blocks (torch: unmap_block).
void CachingAllocator::unmap_block(Block* block) {
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
  Ledger books = ledger(pool.kind);  // as in map_block: nothing to post
  merge_into(block, block->prev, pool, books);
  merge_into(block, block->next, pool, books);
  block->fences.clear();  // the device was synchronized before any unmap
  pool.unmapped.insert(block);
  books.pages_unmapped(end - start);
  note_segment_event(TraceAction::k_segment_unmap, start, end - start, block->stream);
  if (block->prev == nullptr && block->next == nullptr) release_expandable_segment(block);
}

// ================================================================ reclaiming idle pages

// Free blocks of the shared pools' expandable segments holding at least one
// whole page, idle for page_reclaim_age allocator calls, oldest first.
std::vector<Block*> CachingAllocator::idle_pages(size_t min_bytes) const {
  std::vector<Block*> idle;
  const auto age = static_cast<uint64_t>(options_.page_reclaim_age);
  for (const BlockPool* pool : {&pools_.shared(PoolKind::kSmall), &pools_.shared(PoolKind::kLarge)}) {
    for (const FreeEntry& e : pool->free_blocks) {
      const Block* b = e.block;
      const uintptr_t offset = b->address - b->segment->address;
      const bool whole_page = page_layout(pool->kind).ceil(offset) < page_layout(pool->kind).floor(offset + b->size);
      if (b->segment->expandable && whole_page && b->size >= min_bytes && clock_ - b->idle_since >= age)
        idle.push_back(e.block);
    }
  }
  std::sort(idle.begin(), idle.end(), [](const Block* a, const Block* b) { return a->idle_since < b->idle_since; });
  return idle;
}

// Unmaps idle whole pages, oldest first, until `wanted` bytes are unmapped,
// within the budget: reclaiming unmaps at most one run per kMapsPerReclaim
// maps, so the device calls it adds stay a bounded share of the mapping.
void CachingAllocator::reclaim_idle_pages(size_t wanted) {
  auto budget = [&] { return stats_.num_device_map > kMapsPerReclaim * reclaim_unmaps_; };
  const size_t min_bytes = wanted / kReclaimHoleShare;  // small holes cost calls and gain little
  if (!budget() || idle_pages(min_bytes).empty()) return;
  synchronize_and_free_events();  // may free and merge blocks: collect afterwards
  device_.synchronize();          // nothing unmapped may still be in use
  cross_.synchronized();
  size_t reclaimed = 0;
  for (Block* b : idle_pages(min_bytes)) {
    if (reclaimed >= wanted || !budget()) break;
    ++reclaim_unmaps_;
    const int64_t before = stats_.reserved_bytes.current();
    unmap_block(b);
    reclaimed += static_cast<size_t>(before - stats_.reserved_bytes.current());
  }
}

void CachingAllocator::release_expandable_segment(Block* block) {
  Segment* segment = block->segment;
  device_.release_address_range(segment->address, segment->size);
  block->pool->unmapped.erase(block);
  segments_.destroy(block);
}

}  // namespace amem
