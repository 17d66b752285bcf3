// expandable_test.cpp — expandable segments and page reclaim on their own
// (ExpandableSegments, csrc/core/expandable.h; PageReclaim, page_reclaim.h),
// composed by hand over a sim device as the allocator composes them: a range
// reserved once and mapped page by page, growth at the mapped end, fine pages,
// mapping ahead and the memory fraction that stops it, an out-of-memory map
// that changes nothing, unmapping down to a released range; and idle pages
// unmapped within reclaim's budget. (Through the allocator: mechanisms_test.cpp
// and allocator_release_test.cpp.)
#include <gtest/gtest.h>

#include "core/expandable.h"
#include "core/page_reclaim.h"

namespace amem {
namespace {

// The mechanisms below the allocator, wired as CachingAllocator wires them.
struct Pages {
  explicit Pages(const std::string& conf, size_t device_bytes = kGiB)
      : sim(make_sim_backend(device_bytes)), options(Options::parse(conf)) {
    events.set_log(&log);
  }

  // A block of `rounded` bytes mapped for a request on `stream` and handed out (as the allocator's split does, whole).
  Block* take(size_t rounded, StreamId stream = 0) {
    Block* b = expandable.allocate(pool(rounded), stream, rounded);
    if (b != nullptr) b->allocated = true;
    return b;
  }
  // `b` is free again at allocator call `now`, back in its pool's index.
  void give_back(Block* b, uint64_t now = 0) {
    b->allocated = false;
    b->idle_since = now;
    b->pool->insert(b);
  }
  BlockPool& pool(size_t rounded) { return pools.shared(pools.kind_for(rounded)); }
  int64_t reserved() const { return stats.reserved_bytes.current(); }

  std::unique_ptr<Backend> sim;
  Stats stats;
  DeviceLimit device{*sim, stats.reserved_bytes};
  Options options;
  PoolSet pools{options.small_pool};
  SegmentList segments;
  Trace trace;
  SegmentEvents events{trace};
  CrossStreamReuse cross{device, pools, options};
  ExpandableSegments expandable{device, segments, stats, options, cross, events};
  PageReclaim reclaim{expandable, pools, stats, options};
  std::vector<SegmentEvent> log;
};

// ================================================================ ExpandableSegments

TEST(ExpandableSegmentsUnit, OneRangeIsReservedAndMappedAPageAtATime) {
  Pages p("");
  Block* b = p.take(3 * kMiB);
  ASSERT_NE(b, nullptr);
  EXPECT_TRUE(b->segment->expandable);
  EXPECT_EQ(b->size, 20 * kMiB) << "torch's large page";
  EXPECT_EQ(b->segment->size, 1160 * kMiB) << "9/8 of the device, in whole pages";
  EXPECT_EQ(p.reserved(), int64_t(20 * kMiB));
  EXPECT_EQ(p.stats.num_device_map, 1);
  EXPECT_EQ(p.stats.segment.current(), 0) << "expandable segments count mapped bytes only";
  ASSERT_EQ(p.log.size(), 1u);
  EXPECT_EQ(p.log[0].action, TraceAction::k_segment_map);
  EXPECT_EQ(p.log[0].bytes, 20 * kMiB);
  Block* c = p.take(20 * kMiB);
  EXPECT_EQ(c->address, b->address + 20 * kMiB) << "growth maps the next pages of the same range";
  EXPECT_EQ(p.segments.all().size(), 1u);
  EXPECT_EQ(p.pool(3 * kMiB).unmapped.size(), 1u) << "the rest of the range";
}

TEST(ExpandableSegmentsUnit, TheSmallPoolHasTwoMiBPagesAndOneRangePerStream) {
  Pages p("");
  Block* a = p.take(4 * kKiB, 1);
  Block* b = p.take(4 * kKiB, 2);
  EXPECT_EQ(a->size, 2 * kMiB);
  EXPECT_NE(a->segment, b->segment);
  EXPECT_EQ(p.expandable.page_layout(PoolKind::kSmall).page, 2 * kMiB);
}

TEST(ExpandableSegmentsUnit, FinePagesLayOutTheFrontOfALargeSegment) {
  Pages p("large_page_mb:10,fine_pages_mb:8");
  const PageLayout large = p.expandable.page_layout(PoolKind::kLarge);
  EXPECT_EQ(large.page, 10 * kMiB);
  EXPECT_EQ(large.fine_bytes, 8 * kMiB);
  EXPECT_EQ(large.fine_page, 2 * kMiB);
  EXPECT_EQ(p.expandable.page_layout(PoolKind::kSmall).fine_bytes, 0u) << "the small pool is all 2 MiB pages";
  EXPECT_EQ(p.take(3 * kMiB)->size, 4 * kMiB);
  EXPECT_EQ(p.take(12 * kMiB)->size, 14 * kMiB) << "4 MiB of fine pages, then one 10 MiB page";
}

TEST(ExpandableSegmentsUnit, SteadyGrowthMapsAheadUnlessAMemoryFractionIsSet) {
  for (bool capped : {false, true}) {
    Pages p("large_page_mb:10,fine_pages_mb:128,map_ahead:2");
    if (capped) p.device.set_fraction(1.0);
    EXPECT_EQ(p.take(4 * kMiB)->size, 4 * kMiB) << "no growth before it to compare with";
    EXPECT_EQ(p.take(4 * kMiB)->size, capped ? 4 * kMiB : 12 * kMiB) << "room for two more " << capped;
    EXPECT_EQ(p.stats.num_device_map, 2) << capped;
  }
}

TEST(ExpandableSegmentsUnit, AMapTheDeviceCannotBackChangesNothing) {
  Pages p("large_page_mb:2", 64 * kMiB);
  EXPECT_EQ(p.take(70 * kMiB), nullptr) << "the range (72 MiB) has room, the device (64 MiB) has not";
  EXPECT_EQ(p.reserved(), 0);
  EXPECT_EQ(p.stats.num_device_map, 0);
  EXPECT_TRUE(p.log.empty());
  ASSERT_EQ(p.segments.all().size(), 1u) << "the range stays reserved for the next request";
  Block* b = p.take(60 * kMiB);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->address, p.segments.all().begin()->first);
}

TEST(ExpandableSegmentsUnit, UnmappingEveryPageGivesTheRangeBack) {
  Pages p("large_page_mb:2");
  Block* a = p.take(4 * kMiB);
  Block* b = p.take(6 * kMiB);
  p.give_back(a);
  p.expandable.unmap_block(a);
  EXPECT_EQ(p.reserved(), int64_t(6 * kMiB));
  EXPECT_EQ(p.stats.num_device_unmap, 1);
  EXPECT_EQ(p.log.back().action, TraceAction::k_segment_unmap);
  EXPECT_EQ(p.log.back().bytes, 4 * kMiB);
  EXPECT_EQ(p.segments.all().size(), 1u) << "b is still mapped";
  p.give_back(b);
  p.expandable.unmap_block(b);
  EXPECT_EQ(p.reserved(), 0);
  EXPECT_TRUE(p.segments.empty()) << "nothing mapped: the range went back";
  EXPECT_TRUE(p.pool(4 * kMiB).unmapped.empty());
  EXPECT_TRUE(p.pool(4 * kMiB).free_blocks.empty());
}

// Reusing a cached block as it is, is the allocator's best fit; growing one is this.
TEST(ExpandableSegmentsUnit, AFreeBlockAtTheMappedEndGrowsIntoThePagesAfterIt) {
  Pages p("large_page_mb:2");
  p.take(4 * kMiB);
  Block* b = p.take(2 * kMiB);
  const uintptr_t end = b->address;
  p.give_back(b);
  Block* grown = p.take(6 * kMiB);
  EXPECT_EQ(grown->address, end) << "the free 2 MiB and 4 MiB of new pages, merged";
  EXPECT_EQ(grown->size, 6 * kMiB);
  EXPECT_EQ(p.reserved(), int64_t(10 * kMiB));
  EXPECT_TRUE(p.pool(6 * kMiB).free_blocks.empty()) << "taken out of the index for the caller";
}

// ================================================================ PageReclaim

TEST(PageReclaimUnit, WantedOnlyWhenOnLargeEnoughAndAboveThePeak) {
  EXPECT_FALSE(Pages("large_page_mb:2").reclaim.wanted(64 * kMiB)) << "off by default";
  Pages p("large_page_mb:2,page_reclaim_age:0,page_reclaim_min_mb:8");
  EXPECT_TRUE(p.reclaim.wanted(8 * kMiB));
  EXPECT_FALSE(p.reclaim.wanted(6 * kMiB)) << "under page_reclaim_min_mb";
  Block* a = p.take(20 * kMiB);
  p.give_back(a);
  p.stats.reserved_bytes.decrease(PoolKind::kLarge, int64_t(10 * kMiB));  // as if 10 MiB went back
  EXPECT_FALSE(p.reclaim.wanted(8 * kMiB)) << "the growth stays under the peak";
  EXPECT_TRUE(p.reclaim.wanted(12 * kMiB));
  p.stats.reserved_bytes.increase(PoolKind::kLarge, int64_t(10 * kMiB));
}

TEST(PageReclaimUnit, IdlePagesGoBackOldestFirstWithinTheBudget) {
  Pages p("large_page_mb:2,page_reclaim_age:10");
  Block* a = p.take(10 * kMiB);
  p.take(2 * kMiB);
  Block* c = p.take(10 * kMiB);
  p.take(2 * kMiB);
  p.give_back(c, 3);
  p.give_back(a, 5);
  EXPECT_FALSE(p.reclaim.possible(12 * kMiB, 12)) << "c has been idle 9 calls, a 7: younger than 10";
  EXPECT_TRUE(p.reclaim.possible(12 * kMiB, 13)) << "c idle for 10 calls";
  EXPECT_FALSE(p.reclaim.possible(24 * kMiB, 100)) << "holes under half the request are not worth a call";
  p.reclaim.unmap_idle(12 * kMiB, 100);
  EXPECT_EQ(p.stats.num_device_unmap, 1) << "one unmap per four maps: the budget (4 maps) allows one";
  EXPECT_FALSE(c->mapped) << "the oldest first";
  EXPECT_TRUE(a->mapped);
  EXPECT_EQ(p.reserved(), int64_t(14 * kMiB));
  EXPECT_FALSE(p.reclaim.possible(4 * kMiB, 100)) << "the budget is spent until more maps are made";
}

}  // namespace
}  // namespace amem
