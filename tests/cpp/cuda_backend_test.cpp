// cuda_backend_test.cpp — the cuda backend, run against a fake CUDA runtime and
// driver (tests/cpp/fake_cuda) on machines without a GPU: device checks and
// the caller's device restored, OOM answered and CUDA's sticky error cleared,
// other CUDA errors reported with CUDA's message, events, and expandable
// segments through the driver's virtual memory API (whole pages, access set,
// an OOM part-way undone, everything given back). The same code runs on a GPU
// in tests/gpu.
#include <gtest/gtest.h>

#include <thread>

#include "fake_cuda/fake_cuda.h"
#include "test_support.h"

extern "C" int cudaGetDevice(int* device);
extern "C" int cudaSetDevice(int device);
extern "C" int cudaGetLastError();

namespace amem {
namespace {

using test::alloc;
using test::make_cuda;
using test::release;
using test::stat;

constexpr size_t kCapacity = 200 * kMiB;

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fake_cuda_reset(kCapacity);
    ASSERT_EQ(cudaSetDevice(0), 0);
  }
  void TearDown() override { EXPECT_EQ(fake_cuda_counts().violations, 0u) << "a CUDA API rule was broken"; }

  // Nothing is left on the fake device: no memory, handles, mappings, ranges or events.
  static void expect_all_given_back() {
    const FakeCudaCounts c = fake_cuda_counts();
    EXPECT_EQ(c.allocations, 0u);
    EXPECT_EQ(c.handles, 0u);
    EXPECT_EQ(c.mappings, 0u);
    EXPECT_EQ(c.ranges, 0u);
    EXPECT_EQ(c.events, 0u);
    EXPECT_EQ(c.used_bytes[0] + c.used_bytes[1], 0u);
  }
};

TEST_F(CudaBackendTest, ADeviceThatDoesNotExistIsRefusedByName) {
  try {
    make_cuda_backend(2);
    FAIL() << "device 2 of 2 was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA device 2 does not exist"), std::string::npos) << e.what();
  }
}

TEST_F(CudaBackendTest, SegmentsComeFromCudaMallocOnItsDeviceAndTheCallersDeviceIsRestored) {
  {
    auto a = make_cuda(1);
    uintptr_t p = alloc(*a, 3 * kMiB);
    EXPECT_EQ(fake_cuda_counts().allocations, 1u);
    EXPECT_EQ(fake_cuda_counts().used_bytes[1], 20 * kMiB);  // a large segment, on device 1
    EXPECT_EQ(fake_cuda_counts().used_bytes[0], 0u);
    int current = -1;
    ASSERT_EQ(cudaGetDevice(&current), 0);
    EXPECT_EQ(current, 0);
    release(*a, p);
    a->empty_cache();
    EXPECT_EQ(fake_cuda_counts().allocations, 0u);
  }
  expect_all_given_back();
}

TEST_F(CudaBackendTest, WorkOnAnotherDeviceCreatesNoContextOnTheCallersDevice) {
  // Note [switching devices] in cuda_backend.cpp: a thread that never used device 0 allocates and
  // frees on device 1; restoring its device 0 must not create a context there, and torch must
  // still see device 0 as the thread's device. (The fake libc10_cuda.so is linked in, as torch's
  // is loaded in a real process.)
  std::thread([] {
    fake_cuda_reset(kCapacity);  // no contexts; this new thread's current device is 0
    {
      auto a = make_cuda(1, "expandable_segments:True");
      uintptr_t p = alloc(*a, 3 * kMiB);
      release(*a, p);
      a->empty_cache();
      uintptr_t q = alloc(*a, 30 * kMiB);  // pages this time
      release(*a, q);
    }
    EXPECT_TRUE(fake_cuda_has_context(1));
    EXPECT_FALSE(fake_cuda_has_context(0)) << "restoring the caller's device created a context on it";
    EXPECT_EQ(fake_c10_current_device(), 0) << "torch no longer sees the caller's device";
  }).join();
}

// The backend does not look for torch: the bindings find torch's pair (csrc/bind/torch_devices.h)
// and hand it down. Without it the backend switches with the runtime's own calls.
TEST_F(CudaBackendTest, TorchsDeviceSwitchIsHandedDownByTheBindings) {
  const DeviceSwitchFns torch = torch_device_switch();
  EXPECT_NE(torch.exchange, nullptr) << "the fake libc10_cuda.so is loaded: its ExchangeDevice is found";
  EXPECT_NE(torch.maybe_set, nullptr);
  std::thread([] {
    fake_cuda_reset(kCapacity);  // no contexts; this new thread's current device is 0
    {
      CachingAllocator a(make_cuda_backend(1), Options());  // nothing handed down
      a.free(a.malloc(3 * kMiB, 0));
      a.empty_cache();
    }
    EXPECT_TRUE(fake_cuda_has_context(1));
    EXPECT_TRUE(fake_cuda_has_context(0)) << "cudaSetDevice restored device 0 (what torch's pair avoids)";
  }).join();
}

TEST_F(CudaBackendTest, OutOfMemoryIsAnAnswerAndLeavesNoStickyError) {
  auto a = make_cuda(0);
  uintptr_t p = alloc(*a, 150 * kMiB);
  EXPECT_THROW(a->malloc(100 * kMiB, 0), OutOfMemoryError);
  EXPECT_EQ(fake_cuda_counts().sticky_error, 0) << "cudaMalloc's OOM was left pending";
  a->check_valid();
  release(*a, p);
  EXPECT_NE(alloc(*a, 100 * kMiB), 0u);  // frees the cached 150 MiB and retries
  a->check_valid();
}

TEST_F(CudaBackendTest, OtherCudaErrorsCarryCudasMessageAndLeaveTheAllocatorValid) {
  auto a = make_cuda(0);
  fake_cuda_fail_next("cudaMalloc", 101);
  try {
    a->malloc(kMiB, 0);
    FAIL() << "a CUDA error was swallowed";
  } catch (const BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("cudaMalloc failed: invalid device ordinal"), std::string::npos) << e.what();
  }
  EXPECT_EQ(cudaGetLastError(), 0);
  a->check_valid();
  EXPECT_EQ(stat(*a, "reserved_bytes.all.current"), 0);
  EXPECT_NE(alloc(*a, kMiB), 0u);
}

TEST_F(CudaBackendTest, ABlockUsedOnABusyStreamWaitsForItsEvent) {
  auto a = make_cuda(0);
  const StreamId side = 0x7000;
  uintptr_t p = alloc(*a, kMiB);
  a->record_stream(p, side);
  fake_cuda_set_stream_busy(side, true);
  release(*a, p);
  EXPECT_EQ(fake_cuda_counts().events, 1u);
  EXPECT_NE(alloc(*a, kMiB), p);  // its event is not complete: another block serves
  fake_cuda_set_stream_busy(side, false);
  EXPECT_EQ(alloc(*a, kMiB), p);  // the next malloc finds the event complete
  EXPECT_EQ(fake_cuda_counts().events, 0u);
  EXPECT_EQ(cudaGetLastError(), 0) << "cudaEventQuery's not-ready was left pending";
}

// ---------------------------------------------------------------- expandable segments

TEST_F(CudaBackendTest, ExpandableSegmentsMapWholePagesWithAccessAndGiveEverythingBack) {
  {
    auto a = make_cuda(0, "expandable_segments:True");
    uintptr_t small = alloc(*a, 1000);
    uintptr_t large = alloc(*a, 30 * kMiB);  // two 20 MiB pages
    FakeCudaCounts c = fake_cuda_counts();
    EXPECT_EQ(c.ranges, 2u);  // one per pool
    EXPECT_EQ(c.mappings, 3u);  // one 2 MiB page, two 20 MiB pages: one mapping each
    EXPECT_EQ(c.mappings_without_access, 0u);
    EXPECT_EQ(c.used_bytes[0], 42 * kMiB);
    EXPECT_EQ(stat(*a, "reserved_bytes.all.current"), int64_t(42 * kMiB));
    release(*a, large);
    a->empty_cache();
    c = fake_cuda_counts();
    EXPECT_EQ(c.mappings, 1u);  // the small page still holds a block
    EXPECT_EQ(c.handles, 1u);
    EXPECT_EQ(c.ranges, 1u);   // the large range had nothing mapped: given back
    release(*a, small);
    uintptr_t again = alloc(*a, 5 * kMiB);  // the small block's page is free; a new large range
    EXPECT_EQ(fake_cuda_counts().mappings, 2u);
    release(*a, again);
  }  // the allocator goes with a page still mapped: unmapped, released, range freed
  expect_all_given_back();
}

TEST_F(CudaBackendTest, PagesAreMappedForEveryPeerThatCanReachTheDevice) {
  // A P2P copy or a kernel on device 0 reading a tensor of device 1 needs device 0 named in
  // cuMemSetAccess (Note [peer access to pages] in cuda_pages.h); cudaMalloc memory needs no such step.
  auto a = make_cuda(1, "expandable_segments:True");
  uintptr_t p = alloc(*a, 30 * kMiB);
  EXPECT_EQ(fake_cuda_page_readers(p), 0b11u) << "device 0 cannot read device 1's pages";
  EXPECT_EQ(fake_cuda_page_readers(p + 25 * kMiB), 0b11u) << "the second page of the block";
  release(*a, p);
}

TEST_F(CudaBackendTest, PagesAreMappedForTheirOwnDeviceOnlyWhenNoPeerCanReachIt) {
  fake_cuda_set_peer_access(false);  // the fake counts a violation if a peer is named anyway
  auto a = make_cuda(1, "expandable_segments:True");
  uintptr_t p = alloc(*a, kMiB);
  EXPECT_EQ(fake_cuda_page_readers(p), 0b10u);
  release(*a, p);
}

TEST_F(CudaBackendTest, AnOutOfMemoryPartWayThroughAMapUndoesItsPages) {
  auto a = make_cuda(0, "expandable_segments:True");
  uintptr_t held = alloc(*a, 150 * kMiB);  // 8 large pages: 160 MiB of 200
  // 10 MiB are free at the end of the last page; 60 MiB more need 3 pages in one map, and
  // the third does not fit.
  EXPECT_THROW(a->malloc(70 * kMiB, 0), OutOfMemoryError);
  FakeCudaCounts c = fake_cuda_counts();
  EXPECT_EQ(c.mappings, 8u);
  EXPECT_EQ(c.handles, 8u) << "the pages mapped before the OOM were not given back";
  EXPECT_EQ(c.used_bytes[0], 160 * kMiB);
  a->check_valid();
  EXPECT_EQ(stat(*a, "reserved_bytes.all.current"), int64_t(160 * kMiB));
  release(*a, held);
  EXPECT_NE(alloc(*a, 70 * kMiB), 0u);
  a->check_valid();
}

TEST_F(CudaBackendTest, ADriverErrorWhileMappingIsReportedAndUndone) {
  auto a = make_cuda(0, "expandable_segments:True");
  fake_cuda_fail_next("cuMemSetAccess", 1);
  try {
    a->malloc(30 * kMiB, 0);
    FAIL() << "a driver error was swallowed";
  } catch (const BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("invalid argument"), std::string::npos) << e.what();
  }
  EXPECT_EQ(fake_cuda_counts().mappings, 0u);
  EXPECT_EQ(fake_cuda_counts().handles, 0u);
  a->check_valid();
  EXPECT_NE(alloc(*a, 30 * kMiB), 0u);
}

TEST_F(CudaBackendTest, ADeviceWithoutVirtualMemoryRefusesExpandableSegmentsWithTheReason) {
  fake_cuda_set_vmm_supported(false);
  try {
    make_cuda(0, "expandable_segments:True");
    FAIL() << "expandable segments were accepted without virtual memory support";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("does not support virtual memory management"), std::string::npos)
        << e.what();
  }
  EXPECT_NE(alloc(*make_cuda(0), kMiB), 0u);  // without the option the device works as before
}

}  // namespace
}  // namespace amem
