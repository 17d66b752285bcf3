// registry_test.cpp — the process-wide CUDA registry (csrc/bind/device_registry.h)
// on the fake CUDA: a policy's expandable segments give way to plain segments on
// a device that cannot map pages. The registry lives for the whole process, so
// this file holds one test that configures it.
#include <gtest/gtest.h>

#include "bind/device_registry.h"
#include "fake_cuda/fake_cuda.h"
#include "test_support.h"

namespace amem {
namespace {

TEST(RegistryTest, APolicysExpandableSegmentsGiveWayOnADeviceThatCannotMapPages) {
  fake_cuda_reset(200 * kMiB);
  fake_cuda_set_vmm_supported(false);
  registry_use_backend("cuda", 0);
  registry_configure("expandable_segments:True,cross_stream_reuse:handover", /*expandable_optional=*/true);
  testing::internal::CaptureStderr();
  CachingAllocator& a = registry_device(0);
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_FALSE(a.options().expandable_segments);
  EXPECT_EQ(a.options().cross_stream_reuse, CrossStream::kHandover) << "the rest of the policy stays";
  EXPECT_NE(said.find("CUDA device 0 uses plain segments: CUDA device 0 does not support virtual memory"),
            std::string::npos)
      << said;
  uintptr_t p = a.malloc(3 * kMiB, 0);
  EXPECT_EQ(fake_cuda_counts().allocations, 1u);  // cudaMalloc, not pages
  EXPECT_EQ(fake_cuda_counts().mappings, 0u);
  a.free(p);
  a.empty_cache();
  a.check_valid();
  EXPECT_EQ(fake_cuda_counts().violations, 0u);
}

}  // namespace
}  // namespace amem
