// cuda_capture_test.cpp — the allocator on the cuda backend against the rules
// real CUDA enforces around graph capture, events and errors (the fake CUDA in
// tests/cpp/fake_cuda refuses what CUDA refuses): device calls during a
// global-mode capture, private pools and their release, record_stream across
// devices, failed captures, and synchronization.
#include <gtest/gtest.h>

#include <thread>

#include "fake_cuda/fake_cuda.h"
#include "test_support.h"

extern "C" int cudaSetDevice(int device);
extern "C" int cudaGetLastError();
extern "C" int cudaStreamBeginCapture(void* stream, int mode);
extern "C" int cudaStreamEndCapture(void* stream, void** graph);
extern "C" int cudaMalloc(void** p, size_t bytes);

namespace amem {
namespace {

using test::alloc;
using test::make_cuda;
using test::release;
using test::stat;

constexpr size_t kCapacity = 200 * kMiB;
constexpr int kGlobal = 0, kThreadLocal = 1, kRelaxed = 2;  // cudaStreamCaptureMode
constexpr StreamId kCaptureStream = 0x5000;
constexpr PoolId kGraphPool{1, 0};

void* as_stream(StreamId s) { return reinterpret_cast<void*>(s); }

// torch's filter for a graph's pool: the stream is capturing (create_allocate_filter).
bool capturing_filter(StreamId s) { return fake_cuda_stream_capturing(s); }

class CudaCaptureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fake_cuda_reset(kCapacity);
    ASSERT_EQ(cudaSetDevice(0), 0);
  }
  void TearDown() override {
    const FakeCudaCounts c = fake_cuda_counts();
    EXPECT_EQ(c.violations, 0u) << "a CUDA API rule was broken";
    EXPECT_EQ(c.capture_refusals, expected_refusals_) << "a call was refused because a stream was capturing";
    EXPECT_EQ(c.invalidated_captures, expected_refusals_) << "a capture was invalidated";
  }
  size_t expected_refusals_ = 0;  // calls a test makes fail on purpose
  // What torch.cuda.graph does around its body: the pool scope opens before the capture begins.
  static void begin_capture(CachingAllocator& a, int mode = kGlobal) {
    a.begin_allocate_to_pool(kGraphPool, capturing_filter);
    ASSERT_EQ(cudaStreamBeginCapture(as_stream(kCaptureStream), mode), 0);
  }
  static int end_capture(CachingAllocator& a) {
    void* graph = nullptr;
    const int code = cudaStreamEndCapture(as_stream(kCaptureStream), &graph);
    if (code == 0) a.end_allocate_to_pool(kGraphPool);  // torch skips it when the capture failed
    cudaGetLastError();
    return code;
  }
};

// ---------------------------------------------------------------- capture modes (Note [capture mode])

TEST_F(CudaCaptureTest, AFirstAllocationInAGlobalCaptureGetsASegmentWithoutInvalidatingIt) {
  for (int mode : {kGlobal, kThreadLocal, kRelaxed}) {
    auto a = make_cuda(0);
    begin_capture(*a, mode);
    uintptr_t p = alloc(*a, 3 * kMiB, kCaptureStream);  // the private pool is empty: cudaMalloc
    EXPECT_EQ(fake_cuda_counts().allocations, 1u);
    release(*a, p);
    EXPECT_EQ(end_capture(*a), 0) << "mode " << mode;
    a->release_pool(kGraphPool);
  }
}

TEST_F(CudaCaptureTest, AnotherThreadsGlobalCaptureSurvivesThisThreadsSegments) {
  auto a = make_cuda(0);
  std::thread([] { ASSERT_EQ(cudaStreamBeginCapture(as_stream(kCaptureStream), kGlobal), 0); }).join();
  uintptr_t p = alloc(*a, 3 * kMiB);  // this thread, the shared pool: cudaMalloc
  release(*a, p);
  a->empty_cache();                   // cudaFree, and no device-wide synchronization
  EXPECT_EQ(fake_cuda_counts().allocations, 0u);
  void* graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(as_stream(kCaptureStream), &graph), 0);
}

TEST_F(CudaCaptureTest, EmptyCacheDuringACaptureKeepsTheSharedPoolsAndWaitsForNothing) {
  auto a = make_cuda(0);
  uintptr_t p = alloc(*a, 3 * kMiB);
  a->record_stream(p, 0x7000);
  release(*a, p);                     // pending on stream 0x7000's event
  uintptr_t q = alloc(*a, 30 * kMiB);
  release(*a, q);                     // cached
  begin_capture(*a);
  a->empty_cache();                   // nothing synchronizes, nothing of the shared pools goes back
  EXPECT_EQ(fake_cuda_counts().allocations, 2u);
  EXPECT_EQ(end_capture(*a), 0);
  a->empty_cache();                   // after the capture: the event is waited for, and all goes back
  EXPECT_EQ(fake_cuda_counts().allocations, 0u);
  EXPECT_EQ(fake_cuda_counts().events, 0u);
  a->release_pool(kGraphPool);
  a->check_valid();
}

TEST_F(CudaCaptureTest, AGarbageCollectionNeverSynchronizesDuringACapture) {
  auto a = make_cuda(0, "garbage_collection_threshold:0.5");
  a->set_memory_fraction(1.0);
  uintptr_t p = alloc(*a, 150 * kMiB);
  release(*a, p);                     // 150 of 200 MiB cached: over the threshold
  begin_capture(*a);
  uintptr_t q = alloc(*a, 3 * kMiB, kCaptureStream);  // would collect the cache before a new segment
  EXPECT_EQ(fake_cuda_counts().allocations, 2u) << "the shared pool's cache was collected during capture";
  release(*a, q);
  EXPECT_EQ(end_capture(*a), 0);
  a->release_pool(kGraphPool);
}

TEST_F(CudaCaptureTest, TheFakeRefusesCudaMallocInAGlobalCaptureAsCudaDoes) {
  ASSERT_EQ(cudaStreamBeginCapture(as_stream(kCaptureStream), kGlobal), 0);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, kMiB), 900);  // cudaErrorStreamCaptureUnsupported
  void* graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(as_stream(kCaptureStream), &graph), 901);  // invalidated
  EXPECT_EQ(cudaGetLastError(), 901);
  fake_cuda_reset(kCapacity);  // the refusal was this test's point
}

TEST_F(CudaCaptureTest, AGraphsPoolGetsPlainSegmentsEvenWithExpandableSegments) {
  auto a = make_cuda(0, "expandable_segments:True");
  begin_capture(*a);
  uintptr_t p = alloc(*a, 3 * kMiB, kCaptureStream);
  uintptr_t q = alloc(*a, 1000, kCaptureStream);
  EXPECT_EQ(fake_cuda_counts().allocations, 2u);  // one large and one small segment, by cudaMalloc
  EXPECT_EQ(fake_cuda_counts().ranges, 0u) << "a private pool reserved a range of addresses";
  EXPECT_EQ(fake_cuda_counts().mappings, 0u);
  release(*a, p);
  release(*a, q);
  ASSERT_EQ(end_capture(*a), 0);
  uintptr_t r = alloc(*a, 3 * kMiB);              // the shared pool still expands
  EXPECT_EQ(fake_cuda_counts().ranges, 1u);
  release(*a, r);
  a->release_pool(kGraphPool);
  a->empty_cache();
  a->check_valid();
}

// ---------------------------------------------------------------- record_stream and a failing free

TEST_F(CudaCaptureTest, RecordStreamWithAStreamOfAnotherDeviceRecordsTheEventThere) {
  auto a = make_cuda(0);
  const StreamId other_device_stream = 0x7100;
  fake_cuda_set_stream_device(other_device_stream, 1);
  uintptr_t p = alloc(*a, kMiB);
  a->record_stream(p, other_device_stream);
  fake_cuda_set_stream_busy(other_device_stream, true);
  ASSERT_NO_THROW(a->free(p)) << "the event was made on the block's device, not the stream's";
  EXPECT_EQ(fake_cuda_counts().events, 1u);
  EXPECT_NE(alloc(*a, kMiB), p);  // pending on the busy stream
  fake_cuda_set_stream_busy(other_device_stream, false);
  EXPECT_EQ(alloc(*a, kMiB), p);
  a->check_valid();
}

TEST_F(CudaCaptureTest, AFreeTheDeviceRefusesLeavesTheBlockAllocatedAndTheStateWhole) {
  auto a = make_cuda(0);
  uintptr_t p = alloc(*a, kMiB);
  a->record_stream(p, 0x7000);
  a->record_stream(p, 0x7001);
  const std::string before = a->stats_json();
  fake_cuda_fail_after("cudaEventRecord", 1, 999);  // the second stream's event
  EXPECT_THROW(a->free(p), BackendError);
  a->check_valid();
  EXPECT_EQ(a->stats_json(), before) << "stats changed by a free that failed";
  EXPECT_EQ(fake_cuda_counts().events, 0u) << "an event of the failed free was left behind";
  EXPECT_EQ(a->block_info(p).address, p) << "the block was lost";
  release(*a, p);  // the device works again: the free goes through
  a->check_valid();
  EXPECT_EQ(stat(*a, "allocated_bytes.all.current"), 0);
}

// ---------------------------------------------------------------- a failed capture (Note [failed capture])

TEST_F(CudaCaptureTest, AfterAFailedCaptureEventsAreProcessedAndAnOutOfMemoryRetriesAgain) {
  auto a = make_cuda(0);
  uintptr_t big = alloc(*a, 150 * kMiB);
  release(*a, big);                                   // cached in the shared pool
  uintptr_t used = alloc(*a, kMiB);
  a->record_stream(used, 0x7000);
  release(*a, used);                                  // pending on an event that has completed
  begin_capture(*a);
  uintptr_t p = alloc(*a, kMiB, kCaptureStream);
  void* raw = nullptr;
  EXPECT_EQ(cudaMalloc(&raw, kMiB), 900);             // something else breaks the capture
  EXPECT_NE(end_capture(*a), 0);                      // torch throws: no end_allocate_to_pool
  EXPECT_NE(alloc(*a, 100 * kMiB), 0u) << "the out-of-memory retry stayed off";
  EXPECT_EQ(fake_cuda_counts().events, 0u) << "events stayed unprocessed";
  release(*a, p);
  a->check_valid();
  expected_refusals_ = 1;
}

// ---------------------------------------------------------------- releasing a graph's pool (Note [lazy pool release])

TEST_F(CudaCaptureTest, ReleasingAGraphsPoolGivesNothingBackWhileAReplayMayRun) {
  auto a = make_cuda(0);
  begin_capture(*a);
  uintptr_t p = alloc(*a, 3 * kMiB, kCaptureStream);
  release(*a, p);
  ASSERT_EQ(end_capture(*a), 0);
  fake_cuda_set_stream_busy(kCaptureStream, true);  // a replay of the graph is running
  a->release_pool(kGraphPool);                     // torch: before cudaGraphExecDestroy, no sync
  EXPECT_EQ(fake_cuda_counts().allocations, 1u) << "the pool's memory went back under a running replay";
  EXPECT_EQ(a->private_pool_count(), 1u);
  a->empty_cache();                                // the next release gives it back
  EXPECT_EQ(fake_cuda_counts().allocations, 0u);
  EXPECT_EQ(a->private_pool_count(), 0u);
  a->check_valid();
}

}  // namespace
}  // namespace amem
