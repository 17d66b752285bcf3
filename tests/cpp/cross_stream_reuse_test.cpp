// cross_stream_reuse_test.cpp — cross-stream reuse on its own
// (CrossStreamReuse, csrc/core/cross_stream_reuse.h): fences marked by frees,
// which blocks another stream may take in wait and handover modes, the best
// fit among other streams' blocks, what taking a block costs the device, and
// nothing during a capture. Blocks are built by hand in a pool; the device is
// a recording one. (Through the allocator: mechanisms_test.cpp.)
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "core/cross_stream_reuse.h"
#include "core/segment_list.h"

namespace amem {
namespace {

constexpr StreamId kS1 = 0x100, kS2 = 0x200, kS3 = 0x300;

// Events complete unless their stream was busy when recorded; records every stream wait.
class RecordingDevice final : public Backend {
 public:
  const char* name() const override { return "recording"; }
  uintptr_t allocate_segment(size_t) override { return 0; }
  void release_segment(uintptr_t, size_t) override {}
  DeviceMemoryInfo memory_info() override { return {}; }
  EventId record_event(StreamId stream) override {
    ++recorded;
    events_[++next_] = busy.count(stream) ? stream : 0;
    stream_of_[next_] = stream;
    return next_;
  }
  bool event_completed(EventId e) override { return events_.at(e) == 0 || busy.count(events_.at(e)) == 0; }
  void wait_event(EventId e) override { events_.at(e) = 0; }
  void destroy_event(EventId e) override { events_.erase(e); }
  void synchronize() override { busy.clear(); }
  void stream_wait_event(StreamId consumer, EventId e) override { waits.emplace(consumer, stream_of_.at(e)); }

  size_t live_events() const { return events_.size(); }
  std::set<StreamId> busy;
  int recorded = 0;
  std::set<std::pair<StreamId, StreamId>> waits;  // (consumer, producer)

 private:
  EventId next_ = 0;
  std::map<EventId, StreamId> events_;  // live event -> its busy stream, or 0
  std::map<EventId, StreamId> stream_of_;
};

struct Fixture {
  explicit Fixture(const std::string& conf) : options(Options::parse(conf)), reuse(device, pools, options) {}

  // A free block of its own segment on `home`, indexed in the large pool, last used on `used_on`.
  Block* free_block(StreamId home, size_t size, StreamId used_on) {
    BlockPool& pool = pools.shared(PoolKind::kLarge);
    Block* b = segments.create(pool, home, next_address, size, false);
    next_address += size;
    b->used_on = used_on;
    if (reuse.on()) reuse.note_free(b);
    pool.insert(b);
    return b;
  }
  BlockPool& large() { return pools.shared(PoolKind::kLarge); }

  RecordingDevice device;
  Options options;
  PoolSet pools{true};
  SegmentList segments;
  CrossStreamReuse reuse;
  uintptr_t next_address = 0x10000000;
};

TEST(CrossStreamReuseUnit, OffIsOff) {
  Fixture f("");
  EXPECT_FALSE(f.reuse.on());
  EXPECT_TRUE(Fixture("cross_stream_reuse:wait").reuse.on());
  EXPECT_TRUE(Fixture("cross_stream_reuse:handover").reuse.on());
}

TEST(CrossStreamReuseUnit, WaitLetsAnotherStreamTakeABlockOnceItsFreePassed) {
  Fixture f("cross_stream_reuse:wait");
  f.device.busy.insert(kS1);
  Block* b = f.free_block(kS1, 4 * kMiB, kS1);
  EXPECT_EQ(f.device.recorded, 1) << "one event per free";
  EXPECT_TRUE(f.reuse.reusable_by(b, kS1)) << "its own stream orders itself";
  EXPECT_FALSE(f.reuse.reusable_by(b, kS2));
  f.device.busy.erase(kS1);
  EXPECT_TRUE(f.reuse.reusable_by(b, kS2));
  EXPECT_EQ(f.device.live_events(), 0u) << "a passed fence's event is destroyed";
  f.reuse.settle(b, kS2);
  EXPECT_TRUE(b->fences.empty());
  EXPECT_TRUE(f.device.waits.empty()) << "wait mode never makes a stream wait";
}

TEST(CrossStreamReuseUnit, HandoverTakesAtOnceAndOrdersTheStreamWhenTaken) {
  Fixture f("cross_stream_reuse:handover");
  f.device.busy.insert(kS1);
  Block* b = f.free_block(kS1, 4 * kMiB, kS1);
  EXPECT_EQ(f.device.recorded, 0) << "handover records nothing on a free";
  CrossStreamReuse::add_fence(b, Fence{kS3, 1});
  CrossStreamReuse::add_fence(b, Fence{kS2, 1});  // the requesting stream's own fence costs nothing
  EXPECT_TRUE(f.reuse.reusable_by(b, kS2));
  f.reuse.settle(b, kS2);
  const std::set<std::pair<StreamId, StreamId>> want = {{kS2, kS1}, {kS2, kS3}};
  EXPECT_EQ(f.device.waits, want) << "one wait per foreign stream";
  EXPECT_TRUE(b->fences.empty());
  EXPECT_EQ(f.device.live_events(), 0u);
}

TEST(CrossStreamReuseUnit, FindForeignTakesTheBestFitOfTheStreamsWhoseFreesPassed) {
  Fixture f("cross_stream_reuse:wait");
  f.free_block(kS1, 8 * kMiB, kS1);
  Block* fits = f.free_block(kS2, 6 * kMiB, kS2);
  f.free_block(kS2, 3 * kMiB, kS2);  // too small
  f.device.busy.insert(kS3);
  f.free_block(kS3, 5 * kMiB, kS3);  // the best fit, but s3's work may still use it
  f.free_block(kS3 + 1, 5 * kMiB, kS3 + 1);  // the request's own stream: not foreign
  EXPECT_EQ(f.reuse.find_foreign(f.large(), kS3 + 1, 4 * kMiB), fits);
  f.device.busy.clear();
  EXPECT_EQ(f.reuse.find_foreign(f.large(), kS3 + 1, 4 * kMiB)->stream, kS3);
  EXPECT_EQ(f.reuse.find_foreign(f.large(), kS1, 9 * kMiB), nullptr);
}

TEST(CrossStreamReuseUnit, FindForeignKeepsTorchsOversizeRules) {
  Fixture f("cross_stream_reuse:handover,max_split_size_mb:20");
  f.free_block(kS1, 45 * kMiB, kS1);
  EXPECT_EQ(f.reuse.find_foreign(f.large(), kS2, 4 * kMiB), nullptr) << "an oversize block for a small request";
  EXPECT_EQ(f.reuse.find_foreign(f.large(), kS2, 21 * kMiB), nullptr) << "more than 20 MiB larger";
  EXPECT_NE(f.reuse.find_foreign(f.large(), kS2, 30 * kMiB), nullptr);
}

TEST(CrossStreamReuseUnit, NothingForeignDuringACapture) {
  Fixture f("cross_stream_reuse:handover");
  Block* b = f.free_block(kS1, 4 * kMiB, kS1);
  f.pools.open_scope({1, 1}, [](StreamId) { return true; });
  EXPECT_FALSE(f.reuse.reusable_by(b, kS2)) << "no event may be recorded or waited on";
  EXPECT_TRUE(f.reuse.reusable_by(b, kS1));
  f.pools.close_scope({1, 1});
  EXPECT_TRUE(f.reuse.reusable_by(b, kS2));

  Fixture w("cross_stream_reuse:wait");
  w.pools.open_scope({1, 1}, [](StreamId) { return true; });
  Block* c = w.free_block(kS1, 4 * kMiB, kS1);
  EXPECT_EQ(w.device.recorded, 0) << "a free during a capture records no event";
  w.pools.close_scope({1, 1});
  w.device.busy.insert(kS1);
  EXPECT_FALSE(w.reuse.reusable_by(c, kS2)) << "passes with the stream's next completed event";
  w.free_block(kS1, 2 * kMiB, kS1);
  w.device.busy.clear();
  EXPECT_TRUE(w.reuse.reusable_by(c, kS2));
}

TEST(CrossStreamReuseUnit, MergedAndSplitBlocksWaitForEveryFreeTheirBytesSaw) {
  Block a, b, rest;
  CrossStreamReuse::add_fence(&a, Fence{kS1, 3});
  CrossStreamReuse::add_fence(&a, Fence{kS1, 2});  // an earlier free of the same stream adds nothing
  CrossStreamReuse::add_fence(&b, Fence{kS1, 5});
  CrossStreamReuse::add_fence(&b, Fence{kS2, 1});
  CrossStreamReuse::absorb_fences(&a, &b);
  ASSERT_EQ(a.fences.size(), 2u);
  EXPECT_EQ(a.fences[0].stream, kS1);
  EXPECT_EQ(a.fences[0].seq, 5u) << "one fence per stream, the latest";
  EXPECT_EQ(a.fences[1].stream, kS2);
  CrossStreamReuse::share_fences(&a, &rest);
  EXPECT_EQ(rest.fences.size(), 2u);
}

TEST(CrossStreamReuseUnit, ASynchronizedDevicePassesEveryFence) {
  Fixture f("cross_stream_reuse:wait");
  f.device.busy.insert(kS1);
  Block* b = f.free_block(kS1, 4 * kMiB, kS1);
  EXPECT_FALSE(f.reuse.reusable_by(b, kS2));
  f.reuse.synchronized();
  EXPECT_TRUE(f.reuse.reusable_by(b, kS2));
  EXPECT_EQ(f.device.live_events(), 0u);
}

}  // namespace
}  // namespace amem
