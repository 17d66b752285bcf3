// mechanisms_test.cpp — amem's own mechanisms, each on its own: cross-stream
// reuse (wait and handover, on the sim backend and on the cuda backend over the
// fake CUDA), the large pool's page size, fine pages at the front of a segment,
// one pool for every size, and reclaiming idle pages before an expandable
// segment grows, and mapping ahead of steady growth.
#include <gtest/gtest.h>

#include "fake_cuda/fake_cuda.h"
#include "test_support.h"

namespace amem {
namespace {

using test::alloc;
using test::make_cuda;
using test::make_sim;
using test::release;
using test::segments;
using test::stat;
using test::streams_of;

constexpr StreamId kS1 = 0x100, kS2 = 0x200;
constexpr size_t kBig = 12 * kMiB;  // a large request: its own 12 MiB segment, no remainder

// ================================================================ cross-stream reuse

TEST(CrossStreamReuse, OffKeepsABlockOnItsOwnStream) {
  auto a = make_sim();
  uintptr_t p = alloc(*a, kBig, kS1);
  release(*a, p);
  EXPECT_NE(alloc(*a, kBig, kS2), p);
  EXPECT_EQ(stat(*a, "num_device_alloc"), 2);
}

TEST(CrossStreamReuse, HandoverServesAnotherStreamAtOnce) {
  auto a = make_sim(0, "cross_stream_reuse:handover");
  streams_of(*a).set_stream_busy(kS1, true);  // its work has not finished: handover does not care
  uintptr_t p = alloc(*a, kBig, kS1);
  release(*a, p);
  EXPECT_EQ(alloc(*a, kBig, kS2), p);
  EXPECT_EQ(stat(*a, "num_device_alloc"), 1);
}

// Note [traced stream]: seen on an H100/H200 first, where a trace of amem's
// policy showed every allocation on the default stream.
TEST(CrossStreamReuse, TheTraceNamesTheStreamEachRequestCameFrom) {
  auto a = make_sim(0, "cross_stream_reuse:handover");
  a->start_trace(64);
  uintptr_t p = alloc(*a, kBig, kS1);
  release(*a, p);
  ASSERT_EQ(alloc(*a, kBig, kS2), p);  // s1's segment, handed to s2
  release(*a, p);
  const test::Json trace = test::parse_json(a->trace_json());
  std::vector<std::pair<std::string, uint64_t>> seen;
  for (const auto& e : trace["events"].items)
    seen.emplace_back(e["action"].text, e["stream"].as_uint());
  const std::vector<std::pair<std::string, uint64_t>> want = {
      {"segment_alloc", kS1}, {"alloc", kS1}, {"free_requested", kS1}, {"free_completed", kS1},
      {"alloc", kS2},         {"free_requested", kS2}, {"free_completed", kS2}};
  EXPECT_EQ(seen, want);
}

TEST(CrossStreamReuse, WaitServesAnotherStreamOnceTheFreeingStreamFinished) {
  auto a = make_sim(0, "cross_stream_reuse:wait");
  streams_of(*a).set_stream_busy(kS1, true);
  uintptr_t p = alloc(*a, kBig, kS1);
  release(*a, p);
  uintptr_t q = alloc(*a, kBig, kS2);
  EXPECT_NE(q, p) << "the free on s1 has not completed: not reusable on s2";
  streams_of(*a).set_stream_busy(kS1, false);
  EXPECT_EQ(alloc(*a, kBig, kS2), p);
  EXPECT_EQ(stat(*a, "num_device_alloc"), 2);
}

TEST(CrossStreamReuse, ABlockBackOnItsSegmentsStreamStillWaitsForItsLastUser) {
  auto a = make_sim(0, "cross_stream_reuse:wait");
  uintptr_t p = alloc(*a, kBig, kS1);
  release(*a, p);
  ASSERT_EQ(alloc(*a, kBig, kS2), p);  // s1's segment, used on s2
  streams_of(*a).set_stream_busy(kS2, true);
  release(*a, p);
  EXPECT_NE(alloc(*a, kBig, kS1), p) << "s2's work on it may still run";
}

TEST(CrossStreamReuse, MergedAndSplitBlocksKeepEveryStreamsFence) {
  auto a = make_sim(0, "cross_stream_reuse:wait,debug_checks:True");
  uintptr_t x = alloc(*a, 4 * kMiB, kS1), y = alloc(*a, 4 * kMiB, kS1);  // one 20 MiB segment
  release(*a, x);
  ASSERT_EQ(alloc(*a, 4 * kMiB, kS2), x);
  streams_of(*a).set_stream_busy(kS2, true);
  release(*a, x);  // merges with the free rest of the segment: the merged block carries s2's fence
  release(*a, y);
  uintptr_t z = alloc(*a, 2 * kMiB, kS1);
  EXPECT_NE(z, x) << "the piece s2 used is not reusable by s1 yet";
  streams_of(*a).set_stream_busy(kS2, false);
}

TEST(CrossStreamReuse, NeverDuringGraphCapture) {
  auto a = make_sim(0, "cross_stream_reuse:handover,debug_checks:True");
  a->begin_allocate_to_pool({1, 1}, [](StreamId) { return true; });  // capture: no events may be used
  uintptr_t p = alloc(*a, kBig, kS1);
  release(*a, p);
  uintptr_t q = alloc(*a, kBig, kS2);
  EXPECT_NE(q, p);
  a->end_allocate_to_pool({1, 1});
  release(*a, q);
  a->release_pool({1, 1});
  a->empty_cache();  // a released pool's memory goes back at the next empty_cache (Note [lazy pool release])
  EXPECT_EQ(stat(*a, "reserved_bytes.all.current"), 0);
}

// ================================================================ pages

TEST(LargePages, TwoMiBPagesMapWhatARequestNeeds) {
  auto torch = make_sim(0, "expandable_segments:True");
  auto fine = make_sim(0, "expandable_segments:True,large_page_mb:2");
  alloc(*torch, 3 * kMiB);
  alloc(*fine, 3 * kMiB);
  EXPECT_EQ(stat(*torch, "reserved_bytes.all.current"), static_cast<int64_t>(20 * kMiB));
  EXPECT_EQ(stat(*fine, "reserved_bytes.all.current"), static_cast<int64_t>(4 * kMiB));
}

TEST(LargePages, BadSizesAreRefused) {
  for (const char* conf : {"large_page_mb:3", "large_page_mb:0", "large_page_mb:22", "large_page_mb:x"})
    EXPECT_THROW(Options::parse(conf), ConfigError) << conf;
}

TEST(SmallPool, OffServesSmallRequestsFromTheLargePool) {
  auto a = make_sim(0, "expandable_segments:True,large_page_mb:2,small_pool:False");
  alloc(*a, 4096);
  EXPECT_EQ(stat(*a, "allocation.large_pool.current"), 1);
  EXPECT_EQ(stat(*a, "allocation.small_pool.current"), 0);
  EXPECT_EQ(stat(*a, "reserved_bytes.all.current"), static_cast<int64_t>(2 * kMiB));
}

TEST(PageReclaim, IdlePagesGoBackBeforeTheSegmentGrows) {
  const std::string base = "expandable_segments:True,large_page_mb:2,debug_checks:True";
  for (const char* reclaim : {"", ",page_reclaim_age:0"}) {
    auto a = make_sim(0, base + reclaim);
    uintptr_t x = alloc(*a, 10 * kMiB);
    alloc(*a, 10 * kMiB);
    release(*a, x);  // a 10 MiB hole no 12 MiB request fits in
    alloc(*a, 12 * kMiB);
    const bool on = *reclaim != '\0';
    EXPECT_EQ(stat(*a, "reserved_bytes.all.peak"), static_cast<int64_t>((on ? 22 : 32) * kMiB)) << reclaim;
    EXPECT_EQ(stat(*a, "num_device_unmap"), on ? 1 : 0) << reclaim;
  }
}

TEST(PageReclaim, PagesUsedRecentlyStay) {
  auto a = make_sim(0, "expandable_segments:True,large_page_mb:2,page_reclaim_age:5");
  uintptr_t x = alloc(*a, 10 * kMiB);
  alloc(*a, 10 * kMiB);
  release(*a, x);
  alloc(*a, 12 * kMiB);  // the hole was freed 0 calls ago: younger than 5
  EXPECT_EQ(stat(*a, "num_device_unmap"), 0);
  EXPECT_EQ(stat(*a, "reserved_bytes.all.current"), static_cast<int64_t>(32 * kMiB));
}

TEST(PageReclaim, OnlyRequestsOfTheMinimumSizeReclaim) {
  for (size_t request_mib : {12, 16}) {
    auto a = make_sim(0, "expandable_segments:True,large_page_mb:2,page_reclaim_age:0,page_reclaim_min_mb:16,"
                         "debug_checks:True");
    uintptr_t x = alloc(*a, (request_mib - 2) * kMiB);
    alloc(*a, 10 * kMiB);
    release(*a, x);  // a hole 2 MiB short of the request
    alloc(*a, request_mib * kMiB);
    const bool reclaims = request_mib >= 16;
    EXPECT_EQ(stat(*a, "num_device_unmap"), reclaims ? 1 : 0) << request_mib;
    EXPECT_EQ(stat(*a, "reserved_bytes.all.peak"),
              static_cast<int64_t>((reclaims ? request_mib + 10 : 2 * request_mib + 8) * kMiB)) << request_mib;
  }
}

// A reclaimed hole keeps its addresses while the segment grows past it: with
// reclaim a segment reserves twice the device (not torch's 9/8), so growth
// past the hole stays in the same segment.
TEST(PageReclaim, ASegmentGrowsPastAReclaimedHole) {
  auto a = make_sim(100 * kMiB, "expandable_segments:True,large_page_mb:2,page_reclaim_age:0,debug_checks:True");
  uintptr_t x = alloc(*a, 60 * kMiB);
  alloc(*a, 20 * kMiB);
  release(*a, x);  // a 60 MiB hole, unmapped before the next request maps
  uintptr_t z = alloc(*a, 64 * kMiB);
  EXPECT_EQ(stat(*a, "num_device_unmap"), 1);
  EXPECT_EQ(z, x + 80 * kMiB) << "past 9/8 of the device's 100 MiB: the same segment still";
  EXPECT_EQ(segments(*a).size(), 1u);
}

TEST(PageReclaim, UnmapsStayBoundedByWhatIsMapped) {
  auto a = make_sim(0, "expandable_segments:True,large_page_mb:2,page_reclaim_age:0,debug_checks:True");
  std::vector<uintptr_t> live;
  for (int i = 0; i < 200; ++i) {
    live.push_back(alloc(*a, (1 + (i * 7) % 13) * kMiB, i % 3));
    if (live.size() > 5) {
      release(*a, live[(i * 5) % live.size()]);
      live.erase(live.begin() + (i * 5) % live.size());
    }
  }
  EXPECT_LE(stat(*a, "num_device_unmap"), stat(*a, "num_device_map"));
}

// ================================================================ fine pages (Note [fine pages])

TEST(FinePages, TheLayoutIsFinePagesThenLargePages) {
  const PageLayout layout{10 * kMiB, 8 * kMiB, 2 * kMiB};
  EXPECT_EQ(layout.ceil(0), 0u);
  EXPECT_EQ(layout.ceil(3 * kMiB), 4 * kMiB);
  EXPECT_EQ(layout.ceil(8 * kMiB), 8 * kMiB);
  EXPECT_EQ(layout.ceil(9 * kMiB), 18 * kMiB);
  EXPECT_EQ(layout.floor(7 * kMiB), 6 * kMiB);
  EXPECT_EQ(layout.floor(17 * kMiB), 8 * kMiB);
  EXPECT_EQ(layout.floor(29 * kMiB), 28 * kMiB);
  EXPECT_EQ(layout.index_of(6 * kMiB), 3u);
  EXPECT_EQ(layout.index_of(28 * kMiB), 6u);  // four fine pages, two large ones
  EXPECT_EQ(layout.page_at(6 * kMiB), 2 * kMiB);
  EXPECT_EQ(layout.page_at(8 * kMiB), 10 * kMiB);
  const PageLayout plain{20 * kMiB};  // torch's: one page size
  EXPECT_EQ(plain.ceil(1), 20 * kMiB);
  EXPECT_EQ(plain.floor(39 * kMiB), 20 * kMiB);
  EXPECT_EQ(plain.index_of(40 * kMiB), 2u);
}

TEST(FinePages, ASmallSegmentGrowsByTwoMiBAndALargeOneByLargePages) {
  for (const char* fine : {"", ",fine_pages_mb:8"}) {
    auto a = make_sim(0, std::string("expandable_segments:True,large_page_mb:10,debug_checks:True") + fine);
    const bool on = *fine != '\0';
    alloc(*a, 3 * kMiB);
    EXPECT_EQ(stat(*a, "reserved_bytes.all.current"), static_cast<int64_t>((on ? 4 : 10) * kMiB)) << fine;
    alloc(*a, 12 * kMiB);  // past the fine part: large pages
    EXPECT_EQ(stat(*a, "reserved_bytes.all.current"), static_cast<int64_t>((on ? 18 : 20) * kMiB)) << fine;
  }
}

TEST(FinePages, EmptyCacheUnmapsFineAndLargePagesAlike) {
  auto a = make_sim(0, "expandable_segments:True,large_page_mb:10,fine_pages_mb:8,debug_checks:True");
  uintptr_t x = alloc(*a, 3 * kMiB);
  uintptr_t y = alloc(*a, 22 * kMiB);
  release(*a, x);
  a->empty_cache();  // x's first fine page only: the second holds y's start
  EXPECT_EQ(stat(*a, "reserved_bytes.all.current"), static_cast<int64_t>(26 * kMiB));
  release(*a, y);
  a->empty_cache();
  EXPECT_EQ(stat(*a, "reserved_bytes.all.current"), 0);
  EXPECT_EQ(stat(*a, "num_device_unmap"), 2);
}

// ================================================================ mapping ahead (Note [map ahead])

constexpr const char* kAhead = "expandable_segments:True,large_page_mb:10,fine_pages_mb:128,map_ahead:2,debug_checks:True";

TEST(MapAhead, SteadyGrowthByEqualTensorsMapsOncePerThree) {
  for (const bool on : {false, true}) {
    auto a = make_sim(0, std::string("expandable_segments:True,large_page_mb:10,fine_pages_mb:128,debug_checks:True") +
                             (on ? ",map_ahead:2" : ""));
    for (int i = 0; i < 19; ++i) alloc(*a, 4 * kMiB);
    // Off: one map per tensor. On: the first maps exactly (no growth before it to
    // compare with), then each map takes room for two more: 18 tensors in 6 maps.
    EXPECT_EQ(stat(*a, "num_device_map"), on ? 7 : 19) << on;
    EXPECT_EQ(stat(*a, "reserved_bytes.all.current"), static_cast<int64_t>(76 * kMiB)) << on;
  }
}

TEST(MapAhead, NeverPastTheFinePart) {
  auto a = make_sim(0, "expandable_segments:True,large_page_mb:10,fine_pages_mb:16,map_ahead:2,debug_checks:True");
  alloc(*a, 4 * kMiB);
  alloc(*a, 4 * kMiB);  // mapped end at 8 MiB; room for two more would reach 20 MiB
  EXPECT_EQ(stat(*a, "reserved_bytes.all.current"), static_cast<int64_t>(16 * kMiB)) << "stops at the fine part's end";
  alloc(*a, 4 * kMiB);
  alloc(*a, 4 * kMiB);
  EXPECT_EQ(stat(*a, "num_device_map"), 2);
  alloc(*a, 4 * kMiB);  // past the fine part: one 10 MiB page, nothing ahead
  EXPECT_EQ(stat(*a, "reserved_bytes.all.current"), static_cast<int64_t>(26 * kMiB));
}

TEST(MapAhead, OnlyForEqualSizesUnderTenMiB) {
  auto a = make_sim(0, kAhead);
  alloc(*a, 3 * kMiB);
  alloc(*a, 5 * kMiB);  // another size: exact
  alloc(*a, 12 * kMiB);
  alloc(*a, 12 * kMiB);  // the same size, but torch rounds requests of 10 MiB and more to 2 MiB alone
  EXPECT_EQ(stat(*a, "reserved_bytes.all.current"), static_cast<int64_t>(32 * kMiB));
  EXPECT_EQ(stat(*a, "num_device_map"), 4);
}

TEST(MapAhead, TheRoomServesTheNextRequestsAndEmptyCacheUnmapsIt) {
  auto a = make_sim(0, kAhead);
  alloc(*a, 4 * kMiB);
  uintptr_t second = alloc(*a, 4 * kMiB);  // maps 12 MiB: itself and room for two more
  EXPECT_EQ(stat(*a, "reserved_bytes.all.current"), static_cast<int64_t>(16 * kMiB));
  EXPECT_EQ(alloc(*a, 4 * kMiB), second + 4 * kMiB) << "taken from the room, no map";
  EXPECT_EQ(stat(*a, "num_device_map"), 2);
  a->empty_cache();  // the last 4 MiB of room is free: unmapped
  EXPECT_EQ(stat(*a, "reserved_bytes.all.current"), static_cast<int64_t>(12 * kMiB));
}

TEST(MapAhead, MapsExactlyWhenTheDeviceCannotBackTheRoom) {
  auto a = make_sim(10 * kMiB, kAhead);  // room for two tensors and a half
  alloc(*a, 4 * kMiB);
  alloc(*a, 4 * kMiB);  // 12 MiB would pass the limit: maps its own 4 MiB
  EXPECT_EQ(stat(*a, "reserved_bytes.all.current"), static_cast<int64_t>(8 * kMiB));
  EXPECT_EQ(stat(*a, "num_alloc_retries"), 0) << "no out-of-memory path taken";
  EXPECT_EQ(stat(*a, "num_device_map"), 2);
}

// ================================================================ the cuda backend

class CudaMechanisms : public ::testing::Test {
 protected:
  void SetUp() override { fake_cuda_reset(400 * kMiB); }
  void TearDown() override {
    EXPECT_EQ(fake_cuda_counts().violations, 0u) << "a CUDA API rule was broken";
    fake_cuda_set_stream_busy(kS1, false);
  }
};

TEST_F(CudaMechanisms, HandoverMakesTheConsumerWaitOnTheFreeingStream) {
  {
    auto a = make_cuda(0, "cross_stream_reuse:handover");
    fake_cuda_set_stream_busy(kS1, true);
    uintptr_t p = a->malloc(kBig, kS1);
    a->free(p);
    EXPECT_EQ(a->malloc(kBig, kS2), p);
    EXPECT_TRUE(fake_cuda_waited(kS2, kS1));
    EXPECT_EQ(fake_cuda_counts().events, 0u) << "the handover's event is destroyed at once";
    a->check_valid();
  }
  EXPECT_EQ(fake_cuda_counts().allocations, 0u);
}

TEST_F(CudaMechanisms, WaitRecordsAnEventPerFreeAndReusesOnceItCompleted) {
  {
    auto a = make_cuda(0, "cross_stream_reuse:wait");
    fake_cuda_set_stream_busy(kS1, true);
    uintptr_t p = a->malloc(kBig, kS1);
    a->free(p);
    EXPECT_EQ(fake_cuda_counts().events, 1u);
    uintptr_t q = a->malloc(kBig, kS2);
    EXPECT_NE(q, p);
    fake_cuda_set_stream_busy(kS1, false);
    EXPECT_EQ(a->malloc(kBig, kS2), p);
    EXPECT_EQ(fake_cuda_counts().events, 0u) << "completed fences destroy their events";
    EXPECT_EQ(fake_cuda_counts().stream_waits, 0u) << "wait mode never makes a stream wait";
  }
  EXPECT_EQ(fake_cuda_counts().allocations, 0u);
}

TEST_F(CudaMechanisms, ReclaimUnmapsIdlePagesThroughTheDriver) {
  {
    auto a = make_cuda(0, "expandable_segments:True,large_page_mb:2,page_reclaim_age:0");
    uintptr_t x = a->malloc(10 * kMiB, 0);
    a->malloc(10 * kMiB, 0);
    a->free(x);
    a->malloc(12 * kMiB, 0);
    EXPECT_EQ(fake_cuda_counts().used_bytes[0], 22 * kMiB);
    EXPECT_EQ(stat(*a, "num_device_unmap"), 1);
    a->check_valid();
  }
  const FakeCudaCounts c = fake_cuda_counts();
  EXPECT_EQ(c.mappings + c.handles + c.ranges, 0u);
}

// What amem_alloc.enable() configures by default (amem_alloc/policies.py, "amem").
constexpr const char* kAmemPolicy =
    "expandable_segments:True,cross_stream_reuse:handover,large_page_mb:10,fine_pages_mb:128,map_ahead:2,"
    "page_reclaim_age:4,page_reclaim_min_mb:32";

TEST_F(CudaMechanisms, TheAmemPolicyMapsFineThenTenMiBPagesAndHandsBlocksOverWithoutAHostSync) {
  {
    auto a = make_cuda(0, kAmemPolicy);
    fake_cuda_set_stream_busy(kS1, true);
    uintptr_t p = a->malloc(135 * kMiB, kS1);
    EXPECT_EQ(fake_cuda_counts().mappings, 65u) << "128 MiB in 2 MiB pages, then one 10 MiB page";
    EXPECT_EQ(fake_cuda_counts().used_bytes[0], 138 * kMiB);
    EXPECT_EQ(fake_cuda_counts().mappings_without_access, 0u);
    a->free(p);
    uintptr_t q = a->malloc(135 * kMiB, kS2);  // another stream, while kS1's work is still queued
    EXPECT_EQ(fake_cuda_counts().used_bytes[0], 138 * kMiB) << "the freed pages serve kS2: nothing new mapped";
    EXPECT_TRUE(fake_cuda_waited(kS2, kS1));
    a->free(q);
    a->check_valid();
  }
  const FakeCudaCounts c = fake_cuda_counts();
  EXPECT_EQ(c.mappings + c.handles + c.ranges + c.events, 0u);
}

// A large request that no hole fits: the amem policy unmaps the idle hole's pages
// (after a device sync) before mapping, so the device holds the request and not
// the hole too; every driver call legal (TearDown), nothing left at the end.
TEST_F(CudaMechanisms, TheAmemPolicyReclaimsAnIdleHoleForALargeRequest) {
  {
    auto a = make_cuda(0, kAmemPolicy);
    uintptr_t x = a->malloc(60 * kMiB, 0);
    uintptr_t y = a->malloc(20 * kMiB, 0);
    a->free(x);  // a 60 MiB hole
    for (int i = 0; i < 5; ++i) a->free(a->malloc(4096, 0));  // the hole ages past page_reclaim_age
    uintptr_t z = a->malloc(64 * kMiB, 0);
    EXPECT_EQ(stat(*a, "num_device_unmap"), 1);
    // y; z at 80 MiB: 48 MiB of fine pages up to 128 MiB, then two 10 MiB pages; a small page
    EXPECT_EQ(fake_cuda_counts().used_bytes[0], 20 * kMiB + 68 * kMiB + 2 * kMiB);
    a->free(y);
    a->free(z);
    a->check_valid();
  }
  const FakeCudaCounts c = fake_cuda_counts();
  EXPECT_EQ(c.mappings + c.handles + c.ranges + c.events, 0u);
}

// Fine pages through the driver: one physical allocation per layout page (2 MiB in
// the fine part, 10 MiB after it), unmapped whole; every call legal, nothing left.
TEST_F(CudaMechanisms, FinePagesAreOnePhysicalAllocationPerLayoutPage) {
  {
    auto a = make_cuda(0, "expandable_segments:True,large_page_mb:10,fine_pages_mb:8");
    uintptr_t x = a->malloc(3 * kMiB, 0);
    EXPECT_EQ(fake_cuda_counts().mappings, 2u) << "3 MiB in 2 MiB pages";
    uintptr_t y = a->malloc(22 * kMiB, 0);  // 1 MiB left, two more fine pages, two 10 MiB pages
    EXPECT_EQ(fake_cuda_counts().mappings, 6u);
    EXPECT_EQ(fake_cuda_counts().used_bytes[0], 28 * kMiB);
    EXPECT_EQ(fake_cuda_counts().mappings_without_access, 0u);
    a->free(x);
    a->empty_cache();
    EXPECT_EQ(fake_cuda_counts().mappings, 5u) << "x's first fine page only: the next holds y's start";
    a->free(y);
    a->empty_cache();
    a->check_valid();
    EXPECT_EQ(fake_cuda_counts().used_bytes[0], 0u);
  }
  const FakeCudaCounts c = fake_cuda_counts();
  EXPECT_EQ(c.mappings + c.handles + c.ranges + c.events, 0u);
}

// Mapping ahead through the driver: the room is whole 2 MiB pages, each its own
// physical allocation, unmapped whole by empty_cache; every call legal, nothing left.
TEST_F(CudaMechanisms, MapAheadMapsWholeFinePagesAndUnmapsThem) {
  {
    auto a = make_cuda(0, "expandable_segments:True,large_page_mb:10,fine_pages_mb:128,map_ahead:2");
    std::vector<uintptr_t> tensors;
    for (int i = 0; i < 3; ++i) tensors.push_back(a->malloc(4 * kMiB, 0));
    EXPECT_EQ(fake_cuda_counts().mappings, 8u) << "4 MiB, then 12 MiB for the second and two more, in 2 MiB pages";
    EXPECT_EQ(fake_cuda_counts().mappings_without_access, 0u);
    a->empty_cache();
    EXPECT_EQ(fake_cuda_counts().used_bytes[0], 12 * kMiB) << "the unused room unmapped";
    for (uintptr_t t : tensors) a->free(t);
    a->empty_cache();
    a->check_valid();
    EXPECT_EQ(fake_cuda_counts().used_bytes[0], 0u);
  }
  const FakeCudaCounts c = fake_cuda_counts();
  EXPECT_EQ(c.mappings + c.handles + c.ranges + c.events, 0u);
}

}  // namespace
}  // namespace amem
