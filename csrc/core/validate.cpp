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
namespace {

struct Tally {  // figures recomputed from the blocks, per pool kind
  int64_t segments = 0, reserved = 0, allocations = 0, allocated = 0;
  int64_t active = 0, active_bytes = 0, requested = 0, split_free = 0, split_free_bytes = 0;
};

void require(bool ok, const std::string& what) {
  if (!ok) throw std::logic_error("amem invariant broken: " + what);
}

void compare(const PoolStat& stat, const std::array<Tally, 2>& t, int64_t Tally::*field,
             const char* name) {
  int64_t all = t[0].*field + t[1].*field;
  require(stat.by_pool[0].current == all, std::string(name) + ".all.current is " +
                                              std::to_string(stat.by_pool[0].current) +
                                              " but the blocks add up to " + std::to_string(all));
  for (int k = 0; k < 2; ++k)
    require(stat.by_pool[1 + k].current == t[k].*field,
            std::string(name) + (k ? ".large_pool" : ".small_pool") + ".current disagrees with the blocks");
}

}  // namespace

void CachingAllocator::check_valid() const {
  std::lock_guard<std::mutex> lock(mutex_);
  check_valid_locked();
}

void CachingAllocator::check_valid_locked() const {
  std::array<Tally, 2> tally{};
  size_t free_count = 0, allocated_count = 0;
  uintptr_t previous_end = 0;
  for (const auto& [address, seg] : segments_) {
    require(address == seg->address, "segment map key differs from the segment address");
    require(address >= previous_end, "segments overlap");
    previous_end = address + seg->size;
    Tally& t = tally[static_cast<int>(seg->kind)];
    t.segments += 1;
    t.reserved += static_cast<int64_t>(seg->size);
    uintptr_t cursor = seg->address;
    const Block* prev = nullptr;
    bool segment_split = seg->first != nullptr && seg->first->next != nullptr;
    for (const Block* b = seg->first; b != nullptr; prev = b, b = b->next) {
      require(b->address == cursor, "blocks do not tile their segment (gap or overlap)");
      require(b->prev == prev, "a block's prev link is wrong");
      require(b->segment == seg && b->stream == seg->stream, "a block points at the wrong segment");
      require(b->pool == &small_ || b->pool == &large_, "a block has no pool");
      require(b->pool->kind == seg->kind, "a block is in the wrong pool");
      require(b->size > 0 && b->size % kMinBlockSize == 0, "a block size is not a multiple of 512");
      cursor += b->size;
      const bool in_index = b->pool->free_blocks.count(const_cast<Block*>(b)) == 1;
      if (b->allocated) {
        auto it = allocated_.find(b->address);
        require(it != allocated_.end() && it->second == b, "an allocated block is not in the address map");
        require(!in_index, "an allocated block is in the free index");
        allocated_count += 1;
        t.allocations += 1;
        t.allocated += static_cast<int64_t>(b->size);
      } else if (b->pending_events > 0) {
        require(!in_index, "a block waiting on events is in the free index");
      } else {
        require(in_index, "a free block is missing from the free index");
        require(prev == nullptr || !prev->is_free(), "two free neighbours were not merged");
        require(b->requested == 0, "a free block still counts requested bytes");
        free_count += 1;
        if (segment_split) t.split_free += 1, t.split_free_bytes += static_cast<int64_t>(b->size);
      }
      if (!b->is_free()) {
        t.active += 1;
        t.active_bytes += static_cast<int64_t>(b->size);
        t.requested += static_cast<int64_t>(b->requested);
      }
    }
    require(cursor == seg->address + seg->size, "blocks do not cover their whole segment");
  }
  require(free_count == small_.free_blocks.size() + large_.free_blocks.size(),
          "the free index holds blocks that are in no segment");
  require(allocated_count == allocated_.size(), "the address map holds blocks that are not allocated");
  compare(stats_.segment, tally, &Tally::segments, "segment");
  compare(stats_.reserved_bytes, tally, &Tally::reserved, "reserved_bytes");
  compare(stats_.allocation, tally, &Tally::allocations, "allocation");
  compare(stats_.allocated_bytes, tally, &Tally::allocated, "allocated_bytes");
  compare(stats_.active, tally, &Tally::active, "active");
  compare(stats_.active_bytes, tally, &Tally::active_bytes, "active_bytes");
  compare(stats_.requested_bytes, tally, &Tally::requested, "requested_bytes");
  compare(stats_.inactive_split, tally, &Tally::split_free, "inactive_split");
  compare(stats_.inactive_split_bytes, tally, &Tally::split_free_bytes, "inactive_split_bytes");
}

}  // namespace amem
