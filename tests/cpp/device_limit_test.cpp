// device_limit_test.cpp — the memory fraction on its own (DeviceLimit,
// csrc/core/device_limit.h): an adaptor over a sim backend that refuses a
// segment past fraction × the device's total, reading reserved memory from a
// counter it does not keep, and forwards everything else. Then the allocator's
// two kinds of segment under it: the check is the same for both.
#include <gtest/gtest.h>

#include <cmath>

#include "core/device_limit.h"
#include "test_support.h"

namespace amem {
namespace {

using test::alloc;
using test::stat;

constexpr size_t kDevice = 100 * kMiB;

struct Limited {
  std::unique_ptr<Backend> sim = make_sim_backend(kDevice);
  PoolStat reserved;  // what the allocator's ledger keeps
  DeviceLimit limit{*sim, reserved};

  // A segment through the limit, counted as the ledger would.
  uintptr_t take(size_t bytes) {
    uintptr_t address = limit.allocate_segment(bytes);
    if (address != 0) reserved.increase(PoolKind::kLarge, static_cast<int64_t>(bytes));
    return address;
  }
};

TEST(DeviceLimit, WithoutAFractionEverythingTheDeviceHasIsAdmitted) {
  Limited d;
  EXPECT_FALSE(d.limit.capped());
  EXPECT_EQ(d.limit.allowed_bytes(), SIZE_MAX);
  EXPECT_TRUE(d.limit.admits(SIZE_MAX / 2));
  EXPECT_NE(d.take(kDevice), 0u);
  EXPECT_EQ(d.take(2 * kMiB), 0u) << "the device itself is full";
}

TEST(DeviceLimit, AFractionCapsReservedMemoryAtItsShareOfTheDevice) {
  Limited d;
  d.limit.set_fraction(0.5);
  EXPECT_TRUE(d.limit.capped());
  EXPECT_EQ(d.limit.allowed_bytes(), 50 * kMiB);
  EXPECT_NE(d.take(40 * kMiB), 0u);
  EXPECT_TRUE(d.limit.admits(10 * kMiB)) << "up to the cap exactly";
  EXPECT_FALSE(d.limit.admits(10 * kMiB + 512));
  EXPECT_EQ(d.take(20 * kMiB), 0u) << "past the cap: the backend's out-of-memory answer";
  EXPECT_EQ(d.sim->memory_info().free_bytes, 60 * kMiB) << "the refused segment never reached the device";
  EXPECT_NE(d.take(10 * kMiB), 0u);
}

TEST(DeviceLimit, ReadsReservedMemoryFromTheLedgersCounter) {
  Limited d;
  d.limit.set_fraction(0.5);
  d.reserved.increase(PoolKind::kSmall, static_cast<int64_t>(48 * kMiB));  // e.g. pages mapped elsewhere
  EXPECT_FALSE(d.limit.admits(4 * kMiB));
  d.reserved.decrease(PoolKind::kSmall, static_cast<int64_t>(48 * kMiB));
  EXPECT_TRUE(d.limit.admits(4 * kMiB));
}

TEST(DeviceLimit, ABadFractionIsRefusedAndChangesNothing) {
  Limited d;
  for (double f : {-0.1, 1.5, std::nan("")}) EXPECT_THROW(d.limit.set_fraction(f), std::invalid_argument) << f;
  EXPECT_FALSE(d.limit.capped());
  d.limit.set_fraction(0.25);
  EXPECT_THROW(d.limit.set_fraction(2.0), std::invalid_argument);
  EXPECT_EQ(d.limit.allowed_bytes(), 25 * kMiB) << "the cap set before stays";
  d.limit.set_fraction(1.0);
  EXPECT_EQ(d.limit.allowed_bytes(), kDevice);
}

TEST(DeviceLimit, ForwardsEverythingElseToTheDevice) {
  Limited d;
  d.limit.set_fraction(0.1);
  EXPECT_STREQ(d.limit.name(), "sim");
  EXPECT_EQ(d.limit.memory_info().total_bytes, kDevice) << "the device's total, not the cap";
  EXPECT_TRUE(d.limit.supports_expandable());
  uintptr_t range = d.limit.reserve_address_range(64 * kMiB, PageLayout{2 * kMiB});
  ASSERT_NE(range, 0u);
  EXPECT_TRUE(d.limit.map_pages(range, 20 * kMiB)) << "pages are not capped here: the allocator asks admits() first";
  EXPECT_EQ(d.sim->memory_info().free_bytes, 80 * kMiB);
  d.limit.unmap_pages(range, 20 * kMiB);
  d.limit.release_address_range(range, 64 * kMiB);
  auto& streams = *dynamic_cast<SimulatedBackend*>(d.sim.get());
  streams.set_stream_busy(7, true);
  EventId e = d.limit.record_event(7);
  EXPECT_FALSE(d.limit.event_completed(e));
  d.limit.synchronize();
  EXPECT_TRUE(d.limit.event_completed(e));
  d.limit.destroy_event(e);
}

// The allocator charges an expandable segment's growth what a plain segment for
// the request would take, as torch does: the one check, asked with that size.
TEST(DeviceLimit, BothKindsOfSegmentStopAtTheSameRequest) {
  for (const char* conf : {"", "expandable_segments:True,large_page_mb:2"}) {
    auto a = test::make_sim(kGiB, conf);
    a->set_memory_fraction(0.05);  // 51.2 MiB
    uintptr_t p = alloc(*a, 30 * kMiB);
    EXPECT_THROW(a->malloc(22 * kMiB, 0), OutOfMemoryError) << conf;
    alloc(*a, 20 * kMiB);
    EXPECT_EQ(stat(*a, "reserved_bytes.all.current"), int64_t(50 * kMiB)) << conf;
    a->free(p);
  }
}

}  // namespace
}  // namespace amem
