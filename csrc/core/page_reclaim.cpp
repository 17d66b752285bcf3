// page_reclaim.cpp — see Note [page reclaim] in page_reclaim.h.
#include "page_reclaim.h"

#include <algorithm>

namespace amem {
namespace {

constexpr size_t kReclaimHoleShare = 2;  // reclaim holes of at least 1/this of the request
constexpr int64_t kMapsPerReclaim = 4;  // maps per unmap that page reclaim may add (its bound on device calls)

}  // namespace

bool PageReclaim::wanted(size_t rounded) const {
  return options_.page_reclaim_age >= 0 && rounded >= options_.page_reclaim_min_size &&
         stats_.reserved_bytes.current() + static_cast<int64_t>(rounded) > stats_.reserved_bytes.peak();
}

bool PageReclaim::possible(size_t wanted, uint64_t now) const {
  return within_budget() && !idle_pages(wanted / kReclaimHoleShare, now).empty();
}

// Reclaiming unmaps at most one run per kMapsPerReclaim maps, so the device
// calls it adds stay a bounded share of the mapping.
bool PageReclaim::within_budget() const { return stats_.num_device_map > kMapsPerReclaim * unmaps_; }

void PageReclaim::unmap_idle(size_t wanted, uint64_t now) {
  const size_t min_bytes = wanted / kReclaimHoleShare;  // small holes cost calls and gain little
  size_t reclaimed = 0;
  for (Block* b : idle_pages(min_bytes, now)) {
    if (reclaimed >= wanted || !within_budget()) break;
    ++unmaps_;
    const int64_t before = stats_.reserved_bytes.current();
    expandable_.unmap_block(b);
    reclaimed += static_cast<size_t>(before - stats_.reserved_bytes.current());
  }
}

std::vector<Block*> PageReclaim::idle_pages(size_t min_bytes, uint64_t now) const {
  std::vector<Block*> idle;
  const auto age = static_cast<uint64_t>(options_.page_reclaim_age);
  for (const BlockPool* pool : {&pools_.shared(PoolKind::kSmall), &pools_.shared(PoolKind::kLarge)}) {
    const PageLayout layout = expandable_.page_layout(pool->kind);
    for (const FreeEntry& e : pool->free_blocks) {
      const Block* b = e.block;
      const uintptr_t offset = b->address - b->segment->address;
      const bool whole_page = layout.ceil(offset) < layout.floor(offset + b->size);
      if (b->segment->expandable && whole_page && b->size >= min_bytes && now - b->idle_since >= age)
        idle.push_back(e.block);
    }
  }
  std::sort(idle.begin(), idle.end(), [](const Block* a, const Block* b) { return a->idle_since < b->idle_since; });
  return idle;
}

}  // namespace amem
