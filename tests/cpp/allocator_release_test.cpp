// allocator_release_test.cpp — when the allocator gives memory back or holds
// it: the OOM path (release oversize blocks, release the cache, retry, fail
// cleanly), max_split_size and max_non_split_rounding, the garbage collector
// under a memory fraction, and record_stream's deferred reuse (host backend,
// busy streams). check_valid() runs after every operation.
#include <gtest/gtest.h>

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "test_support.h"

namespace amem {
namespace {

using test::block_at;
using test::segment_of;
using test::segments;
using test::alloc;
using test::release;
using test::stat;

// ---------------------------------------------------------------- out of memory

TEST(OutOfMemory, ReleasesCachedSegmentsThenRetries) {
  auto a = test::make_sim(100 * kMiB);
  uintptr_t p[4];
  for (auto& q : p) q = alloc(*a, 20 * kMiB);
  release(*a, p[0]);
  release(*a, p[2]);  // 40 MiB cached in two whole segments, 20 MiB left on the device
  uintptr_t big = alloc(*a, 50 * kMiB);
  EXPECT_EQ(segment_of(*a, big).total_size, 50 * kMiB);
  EXPECT_EQ(stat(*a, "num_alloc_retries"), 1);
  EXPECT_EQ(stat(*a, "num_device_free"), 2);
  EXPECT_EQ(stat(*a, "num_sync_all_streams"), 1);
  EXPECT_EQ(stat(*a, "num_ooms"), 0);
  EXPECT_EQ(stat(*a, "reserved_bytes.all.current"), int64_t(90 * kMiB));
  EXPECT_EQ(segments(*a).size(), 3u);
}

TEST(OutOfMemory, FailsCleanlyAndTheAllocatorStaysUsable) {
  auto a = test::make_sim(100 * kMiB);
  uintptr_t p = alloc(*a, 50 * kMiB), q = alloc(*a, 40 * kMiB);
  const auto reserved = stat(*a, "reserved_bytes.all.current");
  const std::string segs = a->segments_json();
  try {
    a->malloc(20 * kMiB, 0);
    ADD_FAILURE() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("out of memory"), std::string::npos);
  }
  a->check_valid();
  EXPECT_EQ(stat(*a, "num_ooms"), 1);
  EXPECT_EQ(stat(*a, "reserved_bytes.all.current"), reserved);
  EXPECT_EQ(a->segments_json(), segs);
  EXPECT_THROW(a->malloc(15 * kMiB, 5), OutOfMemoryError);  // another stream: same answer
  EXPECT_EQ(stat(*a, "num_ooms"), 2);

  release(*a, p);
  uintptr_t r = alloc(*a, 20 * kMiB);  // now carved from the cached 50 MiB block
  EXPECT_EQ(r, p);
  EXPECT_EQ(stat(*a, "num_device_alloc"), 2);
  release(*a, r);
  release(*a, q);
  a->empty_cache();
  EXPECT_EQ(stat(*a, "reserved_bytes.all.current"), 0);
}

TEST(OutOfMemory, ReleasesOneOversizeBlockBeforeTheWholeCache) {
  auto a = test::make_sim(130 * kMiB, "max_split_size_mb:40");
  uintptr_t oversize = alloc(*a, 70 * kMiB), normal = alloc(*a, 30 * kMiB);
  uintptr_t live = alloc(*a, 20 * kMiB, 1);
  release(*a, oversize);
  release(*a, normal);
  // 45 MiB may not take the 70 MiB block (>= 45 + 20 MiB of non-split rounding)
  // and does not fit on the device: releasing the oversize block is enough.
  uintptr_t p = alloc(*a, 45 * kMiB);
  EXPECT_EQ(stat(*a, "num_device_free"), 1);
  EXPECT_EQ(stat(*a, "num_alloc_retries"), 0);
  EXPECT_EQ(stat(*a, "num_sync_all_streams"), 0);
  EXPECT_EQ(block_at(*a, normal).state, "inactive");  // the normal block stays cached
  EXPECT_EQ(segment_of(*a, p).total_size, 46 * kMiB);
  release(*a, p);
  release(*a, live);
}

// ---------------------------------------------------------------- max_split_size

TEST(MaxSplitSize, OversizeBlocksAreNotSplitNorUsedForSmallerRequests) {
  auto a = test::make_sim(0, "max_split_size_mb:40");
  uintptr_t big = alloc(*a, 50 * kMiB);
  EXPECT_EQ(stat(*a, "oversize_segments.current"), 1);
  EXPECT_EQ(stat(*a, "oversize_allocations.current"), 1);
  release(*a, big);
  EXPECT_EQ(stat(*a, "oversize_allocations.current"), 0);

  uintptr_t mid = alloc(*a, 30 * kMiB);  // below max_split_size: a new segment
  EXPECT_NE(segment_of(*a, mid).address, segment_of(*a, big).address);
  uintptr_t small = alloc(*a, 2 * kMiB);  // below it too: a new 20 MiB segment
  EXPECT_NE(segment_of(*a, small).address, segment_of(*a, big).address);
  EXPECT_EQ(segment_of(*a, big).blocks.size(), 1u);

  uintptr_t again = alloc(*a, 45 * kMiB);  // oversize request takes the oversize block whole
  EXPECT_EQ(again, big);
  EXPECT_EQ(block_at(*a, again).size, 50 * kMiB);
  EXPECT_EQ(segment_of(*a, again).blocks.size(), 1u);
  EXPECT_EQ(stat(*a, "oversize_segments.current"), 1);
  for (uintptr_t p : {mid, small, again}) release(*a, p);
}

TEST(MaxSplitSize, NonSplitRoundingLimitsTheWaste) {
  auto a = test::make_sim(0, "max_split_size_mb:40,max_non_split_rounding_mb:30");
  uintptr_t big = alloc(*a, 70 * kMiB);
  release(*a, big);
  uintptr_t p = alloc(*a, 40 * kMiB);  // 70 >= 40 + 30: refused, new segment
  EXPECT_NE(p, big);
  uintptr_t q = alloc(*a, 41 * kMiB);  // 70 < 41 + 30: takes the 70 MiB block whole
  EXPECT_EQ(q, big);
  EXPECT_EQ(block_at(*a, q).size, 70 * kMiB);
  release(*a, p);
  release(*a, q);
}

// ---------------------------------------------------------------- memory fraction and GC

TEST(MemoryFraction, CapsReservedMemory) {
  auto a = test::make_sim(kGiB);
  a->set_memory_fraction(0.1);  // about 102 MiB
  uintptr_t p = alloc(*a, 100 * kMiB);
  EXPECT_THROW(a->malloc(4 * kMiB, 0), OutOfMemoryError);
  a->check_valid();
  EXPECT_EQ(stat(*a, "reserved_bytes.all.current"), int64_t(100 * kMiB));
  EXPECT_THROW(a->set_memory_fraction(1.5), std::invalid_argument);
  EXPECT_THROW(a->set_memory_fraction(-0.1), std::invalid_argument);
  a->set_memory_fraction(1.0);
  uintptr_t q = alloc(*a, 4 * kMiB);
  release(*a, p);
  release(*a, q);
}

struct GcRun {
  std::unique_ptr<CachingAllocator> a;
  uintptr_t newer[2];  // 62 MiB blocks freed late
  uintptr_t reused;    // 12 MiB block on stream 1, freed late
};

// Fraction 0.5 of 1 GiB (512 MiB allowed); with threshold 0.5 the GC starts
// above 256 MiB reserved. Two 62 MiB segments are freed early, three freed
// late; then a 100 MiB request needs a new segment at 260 MiB reserved.
GcRun run_gc_scenario(const std::string& conf) {
  GcRun run{test::make_sim(kGiB, conf), {}, 0};
  CachingAllocator& a = *run.a;
  a.set_memory_fraction(0.5);
  uintptr_t old[2];
  for (auto& p : old) p = alloc(a, 62 * kMiB);
  for (auto& p : run.newer) p = alloc(a, 62 * kMiB);
  for (uintptr_t p : old) release(a, p);
  for (int i = 0; i < 10; ++i) release(a, run.reused = alloc(a, 12 * kMiB, 1));  // ages the pool
  for (uintptr_t p : run.newer) release(a, p);
  EXPECT_EQ(stat(a, "reserved_bytes.all.current"), int64_t(260 * kMiB));
  alloc(a, 100 * kMiB);
  return run;
}

TEST(GarbageCollection, FreesTheOldestCachedSegments) {
  GcRun run = run_gc_scenario("garbage_collection_threshold:0.5");
  CachingAllocator& a = *run.a;
  EXPECT_EQ(stat(a, "num_device_free"), 2);  // the two old 62 MiB segments
  EXPECT_EQ(stat(a, "reserved_bytes.all.current"), int64_t(236 * kMiB));
  for (uintptr_t p : run.newer) EXPECT_EQ(block_at(a, p).size, 62 * kMiB);
  EXPECT_EQ(block_at(a, run.reused).state, "inactive");
  EXPECT_EQ(stat(a, "num_alloc_retries"), 0);
}

TEST(GarbageCollection, OffWithoutTheThreshold) {
  GcRun run = run_gc_scenario("");
  EXPECT_EQ(stat(*run.a, "num_device_free"), 0);
  EXPECT_EQ(stat(*run.a, "reserved_bytes.all.current"), int64_t(360 * kMiB));
}

// ---------------------------------------------------------------- record_stream

void fill(uintptr_t p, size_t n, unsigned char byte) { std::memset(reinterpret_cast<void*>(p), byte, n); }

bool holds(uintptr_t p, size_t n, unsigned char byte) {
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i)
    if (b[i] != byte) return false;
  return true;
}

TEST(RecordStream, BlockWaitsForABusyStreamBeforeReuse) {
  auto a = test::make_host(64 * kMiB);
  uintptr_t p = alloc(*a, 4096, 1);
  fill(p, 4096, 0xAB);
  a->record_stream(p, 2);
  test::streams_of(*a).set_stream_busy(2, true);
  release(*a, p);
  EXPECT_EQ(block_at(*a, p).state, "active_pending_free");
  EXPECT_EQ(stat(*a, "allocated_bytes.all.current"), 0);
  EXPECT_EQ(stat(*a, "active_bytes.all.current"), 4096);
  EXPECT_EQ(stat(*a, "requested_bytes.all.current"), 4096);
  try {
    a->free(p);
    ADD_FAILURE() << "double free of a pending block did not throw";
  } catch (const InvalidFreeError& e) {
    EXPECT_NE(std::string(e.what()).find("waits for other streams"), std::string::npos);
  }
  a->check_valid();

  uintptr_t q = alloc(*a, 4096, 1);  // p is still in use on stream 2
  EXPECT_NE(q, p);
  fill(q, 4096, 0xCD);
  EXPECT_TRUE(holds(p, 4096, 0xAB));  // stream 2's data was not handed out
  EXPECT_EQ(block_at(*a, p).state, "active_pending_free");

  test::streams_of(*a).set_stream_busy(2, false);
  uintptr_t r = alloc(*a, 4096, 1);  // the event completed: p is the best fit again
  EXPECT_EQ(r, p);
  EXPECT_EQ(stat(*a, "active_bytes.all.current"), 8192);
  release(*a, q);
  release(*a, r);
}

TEST(RecordStream, OwnStreamIsIgnored) {
  auto a = test::make_host(64 * kMiB);
  uintptr_t p = alloc(*a, 4096, 1);
  a->record_stream(p, 1);
  test::streams_of(*a).set_stream_busy(1, true);
  release(*a, p);
  EXPECT_EQ(block_at(*a, p).state, "inactive");
  test::streams_of(*a).set_stream_busy(1, false);
}

TEST(RecordStream, EmptyCacheSynchronizesPendingBlocks) {
  auto a = test::make_host(64 * kMiB);
  uintptr_t p = alloc(*a, 3 * kMiB, 1);
  a->record_stream(p, 2);
  a->record_stream(p, 3);
  test::streams_of(*a).set_stream_busy(2, true);
  test::streams_of(*a).set_stream_busy(3, true);
  release(*a, p);
  EXPECT_EQ(block_at(*a, p).state, "active_pending_free");
  a->empty_cache();
  a->check_valid();
  EXPECT_TRUE(segments(*a).empty());
  EXPECT_EQ(stat(*a, "num_sync_all_streams"), 1);
  EXPECT_EQ(stat(*a, "active_bytes.all.current"), 0);
}

TEST(RecordStream, DestroyingWithLiveAndPendingBlocksIsClean) {
  auto a = test::make_host(64 * kMiB);
  uintptr_t p = alloc(*a, 4096, 1);
  alloc(*a, 5 * kMiB, 1);  // left live on purpose
  a->record_stream(p, 2);
  test::streams_of(*a).set_stream_busy(2, true);
  release(*a, p);
  auto held = segments(*a);
  ASSERT_EQ(held.size(), 2u);  // the pending small block's segment and the live large one
  a.reset();  // sanitizer builds also catch leaks or use-after-free here
  for (const auto& seg : held) {  // the host backend's segments are mmaps: every one was unmapped
    unsigned char resident = 0;
    EXPECT_EQ(mincore(reinterpret_cast<void*>(seg.address), 1, &resident), -1) << seg.address;
    EXPECT_EQ(errno, ENOMEM);
  }
}

// ---------------------------------------------------------------- everything at once

// Every option and every release path together, on a tight sim device: the
// walker must hold after each step, and everything must come back at the end.
TEST(ReleasePaths, RandomSequenceWithEveryOption) {
  auto a = test::make_sim(512 * kMiB,
                          "max_split_size_mb:40,max_non_split_rounding_mb:30,"
                          "garbage_collection_threshold:0.6,roundup_power2_divisions:[1:2,16:8,>:4]");
  a->set_memory_fraction(0.75);
  test::streams_of(*a).set_stream_busy(9, true);
  std::mt19937_64 rng(5);
  std::vector<uintptr_t> live;
  for (int op = 0; op < 20000; ++op) {
    if (live.empty() || (live.size() < 40 && rng() % 2)) {
      size_t size = rng() % 3 ? rng() % (2 * kMiB) + 1 : rng() % (80 * kMiB) + 1;
      try {
        live.push_back(a->malloc(size, rng() % 2));
      } catch (const OutOfMemoryError&) {
      }
    } else {
      size_t i = rng() % live.size();
      if (rng() % 8 == 0) a->record_stream(live[i], 8 + rng() % 2);  // 9 is busy until the end
      a->free(live[i]);
      live[i] = live.back();
      live.pop_back();
    }
    if (op % 1000 == 999) test::streams_of(*a).set_stream_busy(9, op % 2000 == 999);
    a->check_valid();
  }
  EXPECT_GT(stat(*a, "num_ooms"), 0);
  EXPECT_GT(stat(*a, "num_device_free"), 0);
  EXPECT_GT(stat(*a, "oversize_allocations.allocated"), 0);
  for (uintptr_t p : live) a->free(p);
  a->empty_cache();
  a->check_valid();
  EXPECT_EQ(stat(*a, "reserved_bytes.all.current"), 0);
  EXPECT_EQ(stat(*a, "active_bytes.all.current"), 0);
}

}  // namespace
}  // namespace amem
