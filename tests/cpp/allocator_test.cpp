// allocator_test.cpp — the caching allocator's everyday policy on the sim
// backend: pool choice and segment sizes, best fit, split and merge, per-stream
// reuse, size 0, invalid frees and requests, empty_cache, peak and accumulated
// stats. check_valid() runs after every operation.
// (OOM, max_split_size, GC, memory fraction and record_stream: allocator_release_test.cpp.)
#include <gtest/gtest.h>

#include "test_support.h"

namespace amem {
namespace {

using test::block_at;
using test::segment_of;
using test::segments;
using test::alloc;
using test::release;
using test::stat;

// ---------------------------------------------------------------- pools and segments

TEST(Allocator, PoolChoiceAndSegmentSizes) {
  struct Case { size_t request; const char* type; size_t segment; };
  const Case cases[] = {{1, "small", 2 * kMiB},          {kMiB, "small", 2 * kMiB},
                        {kMiB + 1, "large", 20 * kMiB},  {10 * kMiB - 1000, "large", 20 * kMiB},
                        {10 * kMiB, "large", 10 * kMiB}, {11 * kMiB + 1, "large", 12 * kMiB}};
  auto a = test::make_sim();
  size_t requested = 0, rounded = 0, large_reserved = 0;
  StreamId stream = 1;
  for (const Case& c : cases) {  // one stream each, so no request reuses another's segment
    uintptr_t p = alloc(*a, c.request, stream);
    test::SegmentView seg = segment_of(*a, p);
    EXPECT_EQ(seg.type, c.type) << c.request;
    EXPECT_EQ(seg.total_size, c.segment) << c.request;
    EXPECT_EQ(seg.stream, stream);
    EXPECT_EQ(seg.address, p);
    const size_t r = round_size(c.request, a->options());
    const bool split = should_split(pool_for(r), c.segment, r, a->options());
    EXPECT_EQ(block_at(*a, p).size, split ? r : c.segment) << c.request;
    EXPECT_EQ(block_at(*a, p).requested, c.request);
    EXPECT_EQ(block_at(*a, p).state, "active_allocated");
    requested += c.request;
    rounded += split ? r : c.segment;
    if (std::string(c.type) == "large") large_reserved += c.segment;
    ++stream;
  }
  EXPECT_EQ(stat(*a, "segment.small_pool.current"), 2);
  EXPECT_EQ(stat(*a, "segment.large_pool.current"), 4);
  EXPECT_EQ(stat(*a, "reserved_bytes.small_pool.current"), int64_t(4 * kMiB));
  EXPECT_EQ(stat(*a, "reserved_bytes.large_pool.current"), int64_t(large_reserved));
  EXPECT_EQ(stat(*a, "allocated_bytes.all.current"), int64_t(rounded));
  EXPECT_EQ(stat(*a, "requested_bytes.all.current"), int64_t(requested));
  EXPECT_EQ(stat(*a, "allocation.all.current"), 6);
  EXPECT_EQ(stat(*a, "num_device_alloc"), 6);
}

TEST(Allocator, BlockInfoDescribesTheAllocatedBlock) {
  auto a = test::make_sim();
  uintptr_t p = alloc(*a, 1000, 7);
  CachingAllocator::BlockInfo info = a->block_info(p + 100);  // any byte inside
  EXPECT_EQ(info.address, p);
  EXPECT_EQ(info.size, 1024u);
  EXPECT_EQ(info.requested, 1000u);
  EXPECT_EQ(info.stream, 7u);
  EXPECT_GT(info.alloc_seq, 0u);
  release(*a, p);
  EXPECT_EQ(a->block_info(p).address, 0u);
}

// ---------------------------------------------------------------- best fit

TEST(Allocator, BestFitPicksTheSmallestSufficientBlock) {
  auto a = test::make_sim();
  const size_t sizes[] = {4 * kKiB, 8 * kKiB, 4 * kKiB, 16 * kKiB, 4 * kKiB, 12 * kKiB, 4 * kKiB};
  std::vector<uintptr_t> p;
  for (size_t s : sizes) p.push_back(alloc(*a, s));
  for (int i : {1, 3, 5}) release(*a, p[i]);  // free holes of 8, 16 and 12 KiB, kept apart
  EXPECT_EQ(alloc(*a, 10 * kKiB), p[5]);       // 12 KiB: not the earlier 16 KiB, not the tail
  EXPECT_EQ(alloc(*a, 6 * kKiB), p[1]);        // 8 KiB
  EXPECT_EQ(alloc(*a, 14 * kKiB), p[3]);       // 16 KiB
  EXPECT_EQ(stat(*a, "num_device_alloc"), 1);
}

TEST(Allocator, EqualSizesPreferTheLowerAddress) {
  auto a = test::make_sim();
  std::vector<uintptr_t> p;
  for (int i = 0; i < 5; ++i) p.push_back(alloc(*a, 8 * kKiB));
  release(*a, p[3]);
  release(*a, p[1]);
  EXPECT_EQ(alloc(*a, 8 * kKiB), p[1]);
  EXPECT_EQ(alloc(*a, 8 * kKiB), p[3]);
}

// Note [index fingers] and Note [exact-size table] (block.h): neither hint
// ever overrides best fit. Freed in address order, the last freed block is the
// higher one; the lower one must still win.
TEST(Allocator, RememberedBlocksNeverBeatTheLowerAddress) {
  auto a = test::make_sim();
  std::vector<uintptr_t> p;
  for (int i = 0; i < 7; ++i) p.push_back(alloc(*a, 8 * kKiB));
  release(*a, p[1]);
  release(*a, p[3]);
  release(*a, p[5]);
  EXPECT_EQ(alloc(*a, 8 * kKiB), p[1]);
  EXPECT_EQ(alloc(*a, 8 * kKiB), p[3]);
  // p[3] was taken out with p[5] after it in the index; p[5] then merges away
  // (its entry handed to p[4]), so p[3]'s hint names a recycled block.
  release(*a, p[4]);
  release(*a, p[6]);
  release(*a, p[3]);
  a->check_valid();
  EXPECT_EQ(alloc(*a, 8 * kKiB), p[3]);  // p[3] merged with everything after it: its start serves
  a->check_valid();
}

// Note [exact-size table]: once a size owns a slot, every change to the index
// must keep the slot's "lowest block of this size" true: a lower block freed
// later, the lowest taken while a twin remains, the lowest merging into a
// bigger block, a bigger block split down to the size. check_valid compares
// the table with a search after every step.
TEST(Allocator, ExactSizeTableFollowsEveryChangeOfTheIndex) {
  auto a = test::make_sim();
  std::vector<uintptr_t> p;  // p[i] = p[0] + i * 8 KiB
  for (int i = 0; i < 9; ++i) p.push_back(alloc(*a, 8 * kKiB));
  auto expect_next = [&](size_t size, uintptr_t want) {
    EXPECT_EQ(alloc(*a, size), want);
    a->check_valid();
  };
  expect_next(8 * kKiB, p[8] + 8 * kKiB);  // the size now owns its slot, with no free block of its own
  release(*a, p[5]);
  release(*a, p[1]);  // lower, freed later
  release(*a, p[3]);
  a->check_valid();
  expect_next(8 * kKiB, p[1]);  // the lowest goes; its twin p[3] succeeds it
  expect_next(8 * kKiB, p[3]);
  release(*a, p[3]);  // lower than p[5] again
  a->check_valid();
  release(*a, p[4]);  // p[3..5] merge: 24 KiB, no 8 KiB block is left
  a->check_valid();
  expect_next(8 * kKiB, p[3]);  // split off the 24 KiB block; the 16 KiB rest takes its entry
  expect_next(16 * kKiB, p[4]);
  release(*a, p[7]);  // the only free 8 KiB block
  release(*a, p[4]);
  release(*a, p[3]);  // merges with the 16 KiB at p[4]: 24 KiB at p[3]
  a->check_valid();
  expect_next(16 * kKiB, p[3]);  // split: the 8 KiB rest at p[5] is lower than p[7]
  expect_next(8 * kKiB, p[5]);
  expect_next(8 * kKiB, p[7]);
}

// ---------------------------------------------------------------- split and merge

TEST(Allocator, SplitThenMergeBackIntoOneBlock) {
  auto a = test::make_sim();
  uintptr_t p1 = alloc(*a, 1000), p2 = alloc(*a, 5000), p3 = alloc(*a, 512);
  EXPECT_EQ(p2, p1 + 1024);
  EXPECT_EQ(p3, p2 + 5120);
  EXPECT_EQ(segment_of(*a, p1).blocks.size(), 4u);  // three blocks and the free tail
  EXPECT_EQ(stat(*a, "inactive_split.small_pool.current"), 1);
  EXPECT_EQ(stat(*a, "inactive_split_bytes.small_pool.current"), int64_t(2 * kMiB - 6656));

  release(*a, p2);  // both neighbours allocated: no merge
  EXPECT_EQ(segment_of(*a, p1).blocks.size(), 4u);
  EXPECT_EQ(stat(*a, "inactive_split.small_pool.current"), 2);
  release(*a, p1);  // merges with p2's block
  EXPECT_EQ(block_at(*a, p1).size, 6144u);
  EXPECT_EQ(segment_of(*a, p1).blocks.size(), 3u);
  release(*a, p3);  // merges with both sides: one block spans the segment
  test::SegmentView seg = segment_of(*a, p1);
  ASSERT_EQ(seg.blocks.size(), 1u);
  EXPECT_EQ(seg.blocks[0].address, seg.address);
  EXPECT_EQ(seg.blocks[0].size, 2 * kMiB);
  EXPECT_EQ(seg.blocks[0].state, "inactive");
  EXPECT_EQ(stat(*a, "inactive_split.all.current"), 0);
  EXPECT_EQ(stat(*a, "inactive_split_bytes.all.current"), 0);
}

TEST(Allocator, LargeBlocksSplitAndMerge) {
  auto a = test::make_sim();
  uintptr_t p = alloc(*a, 3 * kMiB);
  uintptr_t q = alloc(*a, 5 * kMiB);  // from the 17 MiB remainder
  EXPECT_EQ(q, p + 3 * kMiB);
  EXPECT_EQ(stat(*a, "segment.large_pool.current"), 1);
  release(*a, p);
  release(*a, q);
  ASSERT_EQ(segment_of(*a, p).blocks.size(), 1u);
  EXPECT_EQ(segment_of(*a, p).blocks[0].size, 20 * kMiB);
}

TEST(Allocator, LargeRemainderOfOneMiBIsNotSplit) {
  auto a = test::make_sim();
  uintptr_t p = alloc(*a, 19 * kMiB);  // leaves exactly 1 MiB of the 20 MiB segment
  EXPECT_EQ(block_at(*a, p).size, 20 * kMiB);
  EXPECT_EQ(stat(*a, "allocated_bytes.all.current"), int64_t(20 * kMiB));
  EXPECT_EQ(stat(*a, "requested_bytes.all.current"), int64_t(19 * kMiB));
}

// ---------------------------------------------------------------- streams

TEST(Allocator, BlocksAreReusedOnlyOnTheirOwnStream) {
  auto a = test::make_sim();
  uintptr_t p = alloc(*a, 4 * kKiB, 1);
  release(*a, p);
  uintptr_t q = alloc(*a, 4 * kKiB, 2);
  EXPECT_NE(segment_of(*a, q).address, segment_of(*a, p).address);
  EXPECT_EQ(segment_of(*a, q).stream, 2u);
  EXPECT_EQ(segments(*a).size(), 2u);
  EXPECT_EQ(alloc(*a, 4 * kKiB, 1), p);  // stream 1 gets its cached block back
  EXPECT_EQ(stat(*a, "num_device_alloc"), 2);
}

// ---------------------------------------------------------------- size 0 and bad input

TEST(Allocator, SizeZeroReturnsNullAndChangesNothing) {
  auto a = test::make_sim();
  uintptr_t keep = alloc(*a, 4096);
  const std::string stats = a->stats_json(), segs = a->segments_json();
  EXPECT_EQ(alloc(*a, 0, 3), 0u);
  a->free(0);
  a->check_valid();
  EXPECT_EQ(a->stats_json(), stats);
  EXPECT_EQ(a->segments_json(), segs);
  release(*a, keep);
}

// Each bad free throws InvalidFreeError, counts itself, and changes nothing else.
void expect_invalid_free(CachingAllocator& a, uintptr_t address, const std::string& says) {
  const auto before = test::stats_without(a, "num_invalid_frees");
  const std::string segs = a.segments_json();
  const int64_t count = stat(a, "num_invalid_frees");
  try {
    a.free(address);
    ADD_FAILURE() << "free(" << address << ") did not throw";
  } catch (const InvalidFreeError& e) {
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
  }
  a.check_valid();
  EXPECT_EQ(test::stats_without(a, "num_invalid_frees"), before);
  EXPECT_EQ(a.segments_json(), segs);
  EXPECT_EQ(stat(a, "num_invalid_frees"), count + 1);
}

TEST(Allocator, InvalidFreesThrowAndLeaveTheStateAlone) {
  auto a = test::make_sim();
  uintptr_t small = alloc(*a, 4096), large = alloc(*a, 3 * kMiB), gone = alloc(*a, 8192);
  release(*a, gone);
  expect_invalid_free(*a, 0x1234, "never returned");
  expect_invalid_free(*a, small + 512, "inside the block");
  expect_invalid_free(*a, large + 4096, "inside the block");
  expect_invalid_free(*a, gone, "double free");
  // past the end of every segment (the sim hands out descending addresses: the small segment may
  // lie right above the large one, so the large one's end can be the small one's start)
  uintptr_t past_all = 0;
  for (const auto& seg : segments(*a)) past_all = std::max(past_all, uintptr_t(seg.address + seg.total_size));
  expect_invalid_free(*a, past_all + 4096, "never returned");
  EXPECT_THROW(a->record_stream(gone, 2), InvalidFreeError);
  release(*a, small);  // the real blocks are still freeable
  release(*a, large);
  EXPECT_EQ(stat(*a, "allocated_bytes.all.current"), 0);
}

TEST(Allocator, OversizedRequestIsInvalid) {
  auto a = test::make_sim();
  const std::string stats = a->stats_json();
  EXPECT_THROW(a->malloc(kMaxRequest + 1, 0), InvalidRequestError);
  EXPECT_THROW(a->malloc(SIZE_MAX, 0), InvalidRequestError);
  a->check_valid();
  EXPECT_EQ(a->stats_json(), stats);
}

// ---------------------------------------------------------------- empty_cache

TEST(Allocator, EmptyCacheReleasesOnlyWholeFreeSegments) {
  auto a = test::make_sim();
  uintptr_t live_small = alloc(*a, 4096, 0);
  release(*a, alloc(*a, 4096, 1));     // a whole free small segment
  release(*a, alloc(*a, 3 * kMiB, 0));  // a whole free large segment
  uintptr_t live_large = alloc(*a, 3 * kMiB, 2);
  EXPECT_EQ(segments(*a).size(), 4u);

  a->empty_cache();
  a->check_valid();
  EXPECT_EQ(segments(*a).size(), 2u);
  EXPECT_EQ(segment_of(*a, live_small).blocks.size(), 2u);  // its free tail stays cached
  EXPECT_EQ(segment_of(*a, live_large).total_size, 20 * kMiB);
  EXPECT_EQ(stat(*a, "reserved_bytes.all.current"), int64_t(22 * kMiB));
  EXPECT_EQ(stat(*a, "num_device_free"), 2);
  EXPECT_EQ(stat(*a, "num_empty_cache"), 1);

  release(*a, live_small);
  release(*a, live_large);
  a->empty_cache();
  a->check_valid();
  EXPECT_TRUE(segments(*a).empty());
  EXPECT_EQ(stat(*a, "reserved_bytes.all.current"), 0);
}

// ---------------------------------------------------------------- stats

TEST(Allocator, ResetPeakStats) {
  auto a = test::make_sim();
  uintptr_t big = alloc(*a, 30 * kMiB), small = alloc(*a, 4096);
  release(*a, big);
  EXPECT_EQ(stat(*a, "allocated_bytes.all.peak"), int64_t(30 * kMiB + 4096));
  EXPECT_EQ(stat(*a, "allocated_bytes.all.current"), 4096);
  a->reset_peak_stats();
  a->check_valid();
  EXPECT_EQ(stat(*a, "allocated_bytes.all.peak"), 4096);
  EXPECT_EQ(stat(*a, "allocated_bytes.large_pool.peak"), 0);
  EXPECT_EQ(stat(*a, "reserved_bytes.all.peak"), int64_t(32 * kMiB));  // still cached

  a->empty_cache();
  EXPECT_EQ(stat(*a, "reserved_bytes.all.peak"), int64_t(32 * kMiB));
  a->reset_peak_stats();
  EXPECT_EQ(stat(*a, "reserved_bytes.all.peak"), int64_t(2 * kMiB));
  EXPECT_EQ(stat(*a, "allocation.all.allocated"), 2);  // accumulated counts survive
  release(*a, small);
}

TEST(Allocator, ResetAccumulatedStats) {
  auto a = test::make_sim();
  release(*a, alloc(*a, 4096));
  a->empty_cache();
  EXPECT_EQ(stat(*a, "num_device_alloc"), 1);
  a->reset_accumulated_stats();
  EXPECT_EQ(stat(*a, "allocation.all.allocated"), 0);
  EXPECT_EQ(stat(*a, "allocation.all.freed"), 0);
  EXPECT_EQ(stat(*a, "num_device_alloc"), 0);
  EXPECT_EQ(stat(*a, "num_device_free"), 0);
  EXPECT_EQ(stat(*a, "allocated_bytes.all.peak"), 4096);  // peaks are not accumulated stats
}

// `freed` is derived from allocated, current and the current at the reset
// (stats.h): frees and allocations after a reset with live blocks count from zero.
TEST(Allocator, AccumulatedStatsCountFromTheResetWithLiveBlocks) {
  auto a = test::make_sim();
  uintptr_t live = alloc(*a, 4096), other = alloc(*a, 3 * kMiB);
  a->reset_accumulated_stats();
  release(*a, other);
  EXPECT_EQ(stat(*a, "allocation.all.allocated"), 0);
  EXPECT_EQ(stat(*a, "allocation.all.freed"), 1);
  EXPECT_EQ(stat(*a, "allocation.large_pool.freed"), 1);
  EXPECT_EQ(stat(*a, "allocation.small_pool.freed"), 0);
  EXPECT_EQ(stat(*a, "allocation.all.current"), 1);
  uintptr_t again = alloc(*a, 1000);
  EXPECT_EQ(stat(*a, "allocation.all.allocated"), 1);
  EXPECT_EQ(stat(*a, "allocated_bytes.small_pool.allocated"), 1024);
  EXPECT_EQ(stat(*a, "allocated_bytes.all.freed"), int64_t(3 * kMiB));
  release(*a, again);
  release(*a, live);
  EXPECT_EQ(stat(*a, "allocation.all.freed"), 3);
  EXPECT_EQ(stat(*a, "allocation.all.current"), 0);
}

TEST(Allocator, DebugChecksOptionRunsTheWalker) {
  auto a = test::make_sim(0, "debug_checks:True");
  std::vector<uintptr_t> p;
  for (size_t s : {100u, 5000u, 3000000u, 12000000u}) p.push_back(alloc(*a, s));
  for (uintptr_t q : p) release(*a, q);
  a->empty_cache();
  EXPECT_EQ(stat(*a, "reserved_bytes.all.current"), 0);
}

}  // namespace
}  // namespace amem
