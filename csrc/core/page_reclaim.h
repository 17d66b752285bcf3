// page_reclaim.h — giving idle pages of expandable segments back while they are in use.
//
// Note [page reclaim]
// -------------------
// With page_reclaim_age, before an expandable segment maps new pages, whole
// free pages idle for that many allocator calls are unmapped first, oldest
// first, at most as many bytes as the request maps. So physical memory moves
// to where it is needed, across streams and pools, instead of staying mapped
// in a hole. Bounds on device calls: it runs only when the mapping would raise
// reserved memory above its peak (wanted), takes only holes of at least half
// the request, and adds at most one unmap per kMapsPerReclaim maps; with
// page_reclaim_min_mb, only requests of at least that size reclaim (the large
// request that no hole fits: a 512 MiB tensor beside a 510 MiB hole,
// small_train's pattern; smaller ones find holes soon after and reclaiming for
// them raised the peak, as it did 2.2% on lm_medium_ctx128_training,
// docs/policies.md). Holes that reclaim unmapped keep their addresses while
// the segment grows past them, so with reclaim a segment reserves twice the
// device's memory in addresses (expandable.cpp).
//
// Unmapping memory the device may still use is not allowed, so a reclaim
// synchronizes once; that, and never during a capture, is the allocator's
// part: it asks wanted() and possible(), drains its pending events and
// synchronizes, then calls unmap_idle(). The clock is the allocator's count of
// malloc calls; a block's idle_since is that count when it was last freed.
// Called under the allocator's lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "block.h"
#include "expandable.h"
#include "options.h"
#include "pool_set.h"
#include "stats.h"

namespace amem {

class PageReclaim {
 public:
  PageReclaim(ExpandableSegments& expandable, const PoolSet& pools, const Stats& stats, const Options& options)
      : expandable_(expandable), pools_(pools), stats_(stats), options_(options) {}
  PageReclaim(const PageReclaim&) = delete;
  PageReclaim& operator=(const PageReclaim&) = delete;

  // Whether growing a segment by `rounded` bytes should reclaim first: reclaim
  // is on, the request is large enough, and the growth would pass the peak.
  bool wanted(size_t rounded) const;
  // Whether reclaiming for `wanted` bytes at allocator call `now` can unmap
  // anything: within the budget, and some idle page is large enough.
  bool possible(size_t wanted, uint64_t now) const;
  // Unmaps idle whole pages, oldest first, until `wanted` bytes are unmapped or
  // the budget is spent. The device must be synchronized.
  void unmap_idle(size_t wanted, uint64_t now);

 private:
  bool within_budget() const;
  // Free blocks of the shared pools' expandable segments holding at least one
  // whole page, at least `min_bytes`, idle since page_reclaim_age calls, oldest first.
  std::vector<Block*> idle_pages(size_t min_bytes, uint64_t now) const;

  ExpandableSegments& expandable_;  // unmaps, and lays out the pages
  const PoolSet& pools_;            // the shared pools, where idle pages are looked for
  const Stats& stats_;              // reserved memory and its peak; maps made (the budget)
  const Options& options_;
  int64_t unmaps_ = 0;              // unmaps made by page reclaim (its budget)
};

}  // namespace amem
