// replay_test.cpp — the traced replay (Note [traced replay] in core/replay.h):
// which keys it hands back, where the ring starts and how big it is, and that
// it makes exactly the calls a step-by-step loop over the allocator makes,
// captured pools included.
#include <gtest/gtest.h>

#include <stdexcept>
#include <unordered_map>
#include <vector>

#include "core/replay.h"
#include "test_support.h"

namespace amem {
namespace {

using test::make_sim;
using test::parse_json;

constexpr uint64_t kMiB = 1 << 20;

ReplayOp alloc_op(uint64_t key, uint64_t size, StreamId stream = 0) { return {key, size, stream, kReplayAlloc}; }
ReplayOp free_op(uint64_t key) { return {key, 0, 0, kReplayFree}; }
ReplayOp empty_cache_op() { return {0, 0, 0, kReplayEmptyCache}; }
ReplayOp pool_op(ReplayKind kind, uint64_t pool) { return {pool, 0, 0, kind}; }

// Key reuse, a free of a key never allocated, a size-0 request, empty_cache, three streams, and a
// CUDA graph capture into private pool 1 (Note [captured pools]): a block freed inside it, one
// after it, then the pool released.
std::vector<ReplayOp> program() {
  return {alloc_op(1, 1000),     alloc_op(2, 3 * kMiB),  free_op(1),           free_op(99),
          alloc_op(2, 500),      alloc_op(3, 0),         alloc_op(4, 2000, 7), empty_cache_op(),
          free_op(3),            alloc_op(5, 12 * kMiB), free_op(4),           alloc_op(1, 700),
          pool_op(kReplayBeginPool, 1), alloc_op(6, 4000, 9), alloc_op(7, 5 * kMiB), free_op(6),
          pool_op(kReplayEndPool, 1),   alloc_op(8, 1000),    free_op(7),           pool_op(kReplayReleasePool, 1)};
}

// The loop that the traced replay stands for, one allocator call per op.
TracedReplay step_by_step(CachingAllocator& a, const std::vector<ReplayOp>& ops, size_t start) {
  TracedReplay out;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (i == start) a.start_trace(traced_ring_entries(ops.size(), start));
    const ReplayOp& op = ops[i];
    auto it = out.live.find(op.key);
    if (op.kind == kReplayEmptyCache) {
      a.empty_cache();
      continue;
    }
    if (op.kind == kReplayBeginPool) a.begin_allocate_to_pool({0, op.key}, [](StreamId) { return true; });
    if (op.kind == kReplayEndPool) a.end_allocate_to_pool({0, op.key});
    if (op.kind == kReplayReleasePool) a.release_pool({0, op.key});
    if (op.kind != kReplayAlloc && op.kind != kReplayFree) continue;
    if (it != out.live.end()) a.free(it->second), out.live.erase(it);
    if (op.kind == kReplayFree) continue;
    uintptr_t p = a.malloc(op.size, op.stream);
    if (p == 0) continue;
    out.live[op.key] = p;
    if (i >= start) out.order.push_back(op.key);
  }
  if (start >= ops.size()) a.start_trace(traced_ring_entries(ops.size(), start));
  return out;
}

// The ring's events without their times (two runs never share a clock).
std::vector<std::string> events_of(const CachingAllocator& a) {
  std::vector<std::string> out;
  const test::Json trace = parse_json(a.trace_json());
  for (const auto& e : trace["events"].items)
    out.push_back(e["action"].text + " " + e["addr"].text + " " + e["size"].text + " " + e["stream"].text +
                  " " + e["alloc_seq"].text);
  return out;
}

TEST(TracedReplay, HandsBackTheKeysAllocatedFromStartAndThoseLiveAtTheEnd) {
  auto a = make_sim();
  std::vector<ReplayOp> ops = program();
  TracedReplay r = replay_traced(*a, ops.data(), ops.size(), 4);
  EXPECT_EQ(r.order, (std::vector<uint64_t>{2, 4, 5, 1, 6, 7, 8}));  // key 3 asked for 0 bytes: no block
  ASSERT_EQ(r.live.size(), 4u);
  for (uint64_t key : {2, 5, 1, 8}) EXPECT_EQ(test::block_at(*a, r.live.at(key)).state, "active_allocated");
  EXPECT_EQ(test::block_at(*a, r.live.at(2)).requested, 500u);
  EXPECT_EQ(test::stat(*a, "allocation.all.current"), 4);
  a->check_valid();
}

TEST(TracedReplay, RecordsFromStartWithARingThatDropsNothing) {
  auto a = make_sim();
  std::vector<ReplayOp> ops = program();
  TracedReplay r = replay_traced(*a, ops.data(), ops.size(), 4);
  test::Json trace = parse_json(a->trace_json());
  EXPECT_EQ(trace["recording"].text, "true");
  EXPECT_EQ(trace["max_entries"].as_uint(), kTracedEntriesPerOp * (ops.size() - 4) + kTracedRingSlack);
  EXPECT_EQ(trace["dropped"].as_uint(), 0u);
  size_t allocs = 0;
  for (const auto& e : trace["events"].items) allocs += e["action"].text == "alloc";
  EXPECT_EQ(allocs, r.order.size());  // the n-th alloc event is the n-th key of the order
  EXPECT_EQ(trace["events"].items[0]["action"].text, "free_requested");  // op 4 frees key 2's first block
}

TEST(TracedReplay, MakesTheCallsOfAStepByStepLoop) {
  for (size_t start : {size_t{0}, size_t{5}, size_t{11}, size_t{14}, size_t{20}, size_t{40}}) {
    auto traced = make_sim(), stepped = make_sim();
    std::vector<ReplayOp> ops = program();
    TracedReplay r = replay_traced(*traced, ops.data(), ops.size(), start);
    TracedReplay expected = step_by_step(*stepped, ops, start);
    EXPECT_EQ(r.order, expected.order) << "start " << start;
    EXPECT_EQ(r.live, expected.live) << "start " << start;
    EXPECT_EQ(events_of(*traced), events_of(*stepped)) << "start " << start;
    EXPECT_EQ(traced->segments_json(), stepped->segments_json()) << "start " << start;
  }
}

TEST(TracedReplay, StartPastTheEndRecordsNothingYetLeavesTheRingOn) {
  auto a = make_sim();
  std::vector<ReplayOp> ops = program();
  TracedReplay r = replay_traced(*a, ops.data(), ops.size(), ops.size());
  EXPECT_TRUE(r.order.empty());
  EXPECT_EQ(r.live.size(), 4u);
  test::Json trace = parse_json(a->trace_json());
  EXPECT_EQ(trace["recording"].text, "true");
  EXPECT_EQ(trace["max_entries"].as_uint(), kTracedRingSlack);
  EXPECT_TRUE(trace["events"].items.empty());

  auto empty = make_sim();
  EXPECT_TRUE(replay_traced(*empty, nullptr, 0, 0).order.empty());
  EXPECT_EQ(parse_json(empty->trace_json())["max_entries"].as_uint(), kTracedRingSlack);
}

TEST(TracedReplay, RefusesAPrologueMarkerOrAnUnknownKindBeforeRunningAnything) {
  for (uint64_t kind : {uint64_t{kReplayPrologueEnd}, uint64_t{9}}) {
    auto a = make_sim();
    std::vector<ReplayOp> ops = {alloc_op(1, 1000), {0, 0, 0, kind}};
    EXPECT_THROW(replay_traced(*a, ops.data(), ops.size(), 0), std::invalid_argument);
    EXPECT_EQ(test::stat(*a, "allocation.all.allocated"), 0);
    EXPECT_EQ(parse_json(a->trace_json())["recording"].text, "false");
  }
}

TEST(TracedReplay, OutOfMemoryEndsTheReplay) {
  auto a = make_sim(4 * kMiB);
  std::vector<ReplayOp> ops = {alloc_op(1, 1000), alloc_op(2, 64 * kMiB), alloc_op(3, 1000)};
  EXPECT_THROW(replay_traced(*a, ops.data(), ops.size(), 0), OutOfMemoryError);
  EXPECT_EQ(test::stat(*a, "allocation.all.allocated"), 1);  // op 3 never ran
}

}  // namespace
}  // namespace amem
