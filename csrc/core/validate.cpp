// validate.cpp — the is_valid() walker: every invariant the allocator relies
// on, checked from scratch over all segments and blocks.
//
// Called after every operation when debug_checks is on, and by the tests after
// every step. It recomputes the figures from the blocks themselves and
// compares them with the counters, so a counter updated in the wrong place, a
// block lost from the index, an overlap or a gap is caught at the step that
// caused it.
#include <array>
#include <unordered_set>

#include "caching_allocator.h"

namespace amem {

struct ValidationCounts {  // blocks found, to compare with the indexes' sizes
  size_t free = 0, unmapped = 0, allocated = 0;
};

struct ValidationTally {  // figures recomputed from the blocks, per pool kind
  int64_t segments = 0, reserved = 0, oversize_segments = 0, allocations = 0, allocated = 0;
  int64_t active = 0, active_bytes = 0, requested = 0, split_free = 0, split_free_bytes = 0;
};

namespace {



void require(bool ok, const std::string& what) {
  if (!ok) throw std::logic_error("amem invariant broken: " + what);
}

void compare(const PoolStat& stat, const std::array<ValidationTally, 2>& t, int64_t ValidationTally::*field,
             const char* name) {
  int64_t all = t[0].*field + t[1].*field;
  require(stat.current() == all, std::string(name) + ".all.current is " +
                                              std::to_string(stat.current()) +
                                              " but the blocks add up to " + std::to_string(all));
  for (int k = 0; k < 2; ++k)
    require(stat.pools[k].current == t[k].*field,
            std::string(name) + (k ? ".large_pool" : ".small_pool") + ".current disagrees with the blocks");
}

}  // namespace

void CachingAllocator::check_valid() const {
  Guard guard(*this);
  check_valid_locked();
}

void CachingAllocator::check_valid_locked() const {
  std::array<ValidationTally, 2> tally{};
  ValidationCounts counts;
  uintptr_t previous_end = 0;
  for (const auto& [address, seg] : segments_.all()) {
    require(address == seg->address, "segment map key differs from the segment address");
    require(address >= previous_end, "segments overlap");
    previous_end = address + seg->size;
    check_segment(*seg, tally[static_cast<int>(seg->kind)], counts);
  }
  size_t indexed_free = 0, indexed_unmapped = 0;
  for (const BlockPool* pool : pools_.all()) {
    indexed_free += pool->free_blocks.size(), indexed_unmapped += pool->unmapped.size();
    const FreeEntry* previous = nullptr;  // in-place rewrites (block.h) must keep the order
    for (const FreeEntry& e : pool->free_blocks) {
      require(previous == nullptr || FreeEntryLess()(*previous, e), "the free index is out of order");
      previous = &e;
    }
    require(pool->exact_table_is_true(), "the exact-size table names a block that is not its key's best fit");
  }
  require(counts.free == indexed_free, "the free index holds blocks that are in no segment");
  require(counts.unmapped == indexed_unmapped, "the unmapped index holds blocks that are in no segment");
  require(pools_.ids_are_true(), "a private pool has the wrong id");
  require(counts.allocated == allocated_.size(), "the address map holds blocks that are not allocated");
  compare(stats_.segment, tally, &ValidationTally::segments, "segment");
  compare(stats_.reserved_bytes, tally, &ValidationTally::reserved, "reserved_bytes");
  const int64_t oversize = tally[0].oversize_segments + tally[1].oversize_segments;
  require(stats_.oversize_segments.current == oversize,
          "oversize_segments.current is " + std::to_string(stats_.oversize_segments.current) +
              " but the segments add up to " + std::to_string(oversize));
  compare(stats_.allocation, tally, &ValidationTally::allocations, "allocation");
  compare(stats_.allocated_bytes, tally, &ValidationTally::allocated, "allocated_bytes");
  compare(stats_.active, tally, &ValidationTally::active, "active");
  compare(stats_.active_bytes, tally, &ValidationTally::active_bytes, "active_bytes");
  compare(stats_.requested_bytes, tally, &ValidationTally::requested, "requested_bytes");
  compare(stats_.inactive_split, tally, &ValidationTally::split_free, "inactive_split");
  compare(stats_.inactive_split_bytes, tally, &ValidationTally::split_free_bytes, "inactive_split_bytes");
}

// Blocks tile the segment; each block is where its state says it is.
// Expandable segments: reserved counts mapped bytes only, and neither the
// segment nor its free blocks count as segment / inactive split (torch).
void CachingAllocator::check_segment(const Segment& seg, ValidationTally& t, ValidationCounts& counts) const {
  if (!seg.expandable) {
    t.segments += 1, t.reserved += static_cast<int64_t>(seg.size);
    if (seg.size >= options_.max_split_size) t.oversize_segments += 1;
  }
  const bool split = !seg.expandable && seg.first != nullptr && seg.first->next != nullptr;
  uintptr_t cursor = seg.address;
  const Block* prev = nullptr;
  for (const Block* b = seg.first; b != nullptr; prev = b, b = b->next) {
    require(b->address == cursor, "blocks do not tile their segment (gap or overlap)");
    require(b->prev == prev, "a block's prev link is wrong");
    require(b->segment == &seg && b->stream == seg.stream, "a block points at the wrong segment");
    require(b->pool == seg.first->pool && b->pool->kind == seg.kind, "a block is in the wrong pool");
    require(b->pool->owner == kDefaultPool ? b->pool == &pools_.shared(seg.kind) : pools_.has_private(b->pool->owner),
            "a block's pool is neither shared nor a live private pool");
    require(b->size > 0 && b->size % kMinBlockSize == 0, "a block size is not a multiple of 512");
    require(b->mapped || seg.expandable, "an ordinary segment has an unmapped block");
    cursor += b->size;
    if (seg.expandable && b->mapped) t.reserved += static_cast<int64_t>(b->size);
    check_block(b, prev, split, t, counts);
  }
  require(cursor == seg.address + seg.size, "blocks do not cover their whole segment");
}

void CachingAllocator::check_block(const Block* b, const Block* prev, bool split, ValidationTally& t,
                                   ValidationCounts& counts) const {
  auto* block = const_cast<Block*>(b);
  const bool in_index = b->pool->free_blocks.count(entry_of(b)) == 1;
  require(b->indexed == in_index && (!in_index || b->position->block == b),
          "a block's free-index entry is missing, stale or points elsewhere");
  require(b->indexed || !b->exact_lowest, "a block out of the free index is named by the exact-size table");
  const bool in_unmapped = b->pool->unmapped.count(block) == 1;
  if (b->allocated) {
    require(allocated_.find(b->address) == b, "an allocated block is not in the address map");
    require(!in_index && !in_unmapped && b->mapped, "an allocated block is in a free index");
    counts.allocated += 1;
    t.allocations += 1;
    t.allocated += static_cast<int64_t>(b->size);
  } else if (b->pending_events > 0) {
    require(!in_index && !in_unmapped, "a block waiting on events is in a free index");
  } else if (!b->mapped) {
    require(in_unmapped && !in_index, "an unmapped block is missing from the unmapped index");
    require(prev == nullptr || prev->mapped || !prev->is_available(), "two unmapped neighbours were not merged");
    counts.unmapped += 1;
  } else {
    require(in_index && !in_unmapped, "a free block is missing from the free index");
    require(prev == nullptr || !prev->is_free(), "two free neighbours were not merged");
    require(b->requested == 0, "a free block still counts requested bytes");
    counts.free += 1;
    if (split) t.split_free += 1, t.split_free_bytes += static_cast<int64_t>(b->size);
  }
  if (b->allocated || b->pending_events > 0) {
    t.active += 1;
    t.active_bytes += static_cast<int64_t>(b->size);
    t.requested += static_cast<int64_t>(b->requested);
  }
}

}  // namespace amem
