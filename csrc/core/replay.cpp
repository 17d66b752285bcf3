// replay.cpp — the replay loop and its traced variant (see replay.h).
#include "replay.h"

#include <stdexcept>
#include <string>
#include <unordered_map>

namespace amem {
namespace {

// ---------------------------------------------------------------- captured pools (both loops)

// Note [captured pools] (replay.h): while a capture is open every request goes to its pool.
PoolId captured_pool(const ReplayOp& op) { return {0, op.key}; }

void run_pool_op(CachingAllocator& allocator, const ReplayOp& op) {
  switch (op.kind) {
    case kReplayBeginPool: allocator.begin_allocate_to_pool(captured_pool(op), [](StreamId) { return true; }); break;
    case kReplayEndPool: allocator.end_allocate_to_pool(captured_pool(op)); break;
    default: allocator.release_pool(captured_pool(op)); break;
  }
}

constexpr uint64_t kind_bit(uint64_t kind) { return uint64_t{1} << kind; }
constexpr uint64_t kPoolKinds = kind_bit(kReplayBeginPool) | kind_bit(kReplayEndPool) | kind_bit(kReplayReleasePool);

// Every op's kind is one of `accepted` (a bit per kind); `kinds` names them for the error.
void check_kinds(const ReplayOp* ops, size_t count, uint64_t accepted, const char* kinds) {
  for (size_t i = 0; i < count; ++i)
    if (ops[i].kind >= 64 || (accepted & kind_bit(ops[i].kind)) == 0)
      throw std::invalid_argument("amem: replay op " + std::to_string(i) + " has unknown kind " +
                                  std::to_string(ops[i].kind) + " (" + kinds + ")");
}

// ---------------------------------------------------------------- the replay loop

struct Replayer {
  CachingAllocator& allocator;
  ReplayResult result;
  std::unordered_map<uint64_t, uintptr_t> live;  // trace key -> our address
  size_t sample_every = 1;
  bool record_segments = false;
  size_t stamped = 0;  // segment events already given their op index

  void alloc(const ReplayOp& op) {
    result.allocs += 1;
    auto it = live.find(op.key);
    if (it != live.end()) {  // the trace lost a free: release the old block first
      result.duplicate_allocs += 1;
      allocator.free(it->second);
      live.erase(it);
    }
    try {
      live.emplace(op.key, allocator.malloc(op.size, op.stream));
    } catch (const OutOfMemoryError&) {
      result.failed_allocs += 1;
    }
  }

  void free(const ReplayOp& op) {
    result.frees += 1;
    auto it = live.find(op.key);
    if (it == live.end()) {
      result.unknown_frees += 1;
      return;
    }
    allocator.free(it->second);
    live.erase(it);
  }

  void release() {
    result.releases += 1;
    allocator.empty_cache();
  }

  // The state the trace started in is rebuilt: measure from here.
  void end_prologue(uint64_t index) {
    allocator.reset_peak_stats();
    auto f = allocator.figures();
    result.peak_allocated = f.allocated;
    result.peak_reserved = f.reserved;
    result.samples.clear();
    result.prologue_end = static_cast<int64_t>(index);
    if (record_segments) start_segment_log();
  }

  void start_segment_log() {
    result.segment_events.clear();
    stamped = 0;
    allocator.set_segment_log(&result.segment_events);
  }

  // The segment events op `index` caused.
  void stamp(uint64_t index) {
    for (; stamped < result.segment_events.size(); ++stamped) result.segment_events[stamped].op = index;
  }

  void sample(uint64_t index, bool force) {
    auto f = allocator.figures();
    bool new_peak = f.allocated > result.peak_allocated || f.reserved > result.peak_reserved;
    result.peak_allocated = std::max(result.peak_allocated, f.allocated);
    result.peak_reserved = std::max(result.peak_reserved, f.reserved);
    if (force || new_peak || index % sample_every == 0) {
      if (!result.samples.empty() && result.samples.back().op == index) return;
      result.samples.push_back({index, f.allocated, f.reserved});
    }
  }
};

}  // namespace

ReplayResult replay(CachingAllocator& allocator, const ReplayOp* ops, size_t count, size_t max_samples,
                    bool record_segments) {
  check_kinds(ops, count, kind_bit(kReplayAlloc) | kind_bit(kReplayFree) | kind_bit(kReplayEmptyCache) |
                              kind_bit(kReplayPrologueEnd) | kPoolKinds,
              "0 alloc, 1 free, 2 empty_cache, 3 end of prologue, 4-6 captured pools");
  Replayer r{allocator, {}, {}, 1, record_segments, 0};
  r.live.reserve(1024);
  bool has_prologue = false;
  for (size_t i = 0; i < count && !has_prologue; ++i) has_prologue = ops[i].kind == kReplayPrologueEnd;
  if (record_segments && !has_prologue) r.start_segment_log();
  r.sample_every = max_samples > 0 ? std::max<size_t>(1, count / max_samples) : count + 1;
  for (size_t i = 0; i < count; ++i) {
    switch (ops[i].kind) {
      case kReplayAlloc: r.alloc(ops[i]); break;
      case kReplayFree: r.free(ops[i]); break;
      case kReplayEmptyCache: r.release(); break;
      case kReplayPrologueEnd: r.end_prologue(i); break;
      default: run_pool_op(allocator, ops[i]); break;
    }
    r.sample(i, i + 1 == count);
    if (record_segments) r.stamp(i);
  }
  if (record_segments) allocator.set_segment_log(nullptr);
  r.result.ops = count;
  return r.result;
}

// ================================================================ the traced replay (Note [traced replay])

namespace {

struct TracedReplayer {
  CachingAllocator& allocator;
  TracedReplay result;

  void free(uint64_t key) {
    auto it = result.live.find(key);
    if (it == result.live.end()) return;  // not live: ignored
    allocator.free(it->second);
    result.live.erase(it);
  }

  void alloc(const ReplayOp& op, bool recording) {
    free(op.key);  // a live key's old block goes first
    uintptr_t address = allocator.malloc(op.size, op.stream);
    if (address == 0) return;  // size 0: no block, no alloc event
    result.live.emplace(op.key, address);
    if (recording) result.order.push_back(op.key);
  }

  void run(const ReplayOp& op, bool recording) {
    switch (op.kind) {
      case kReplayAlloc: alloc(op, recording); break;
      case kReplayFree: free(op.key); break;
      case kReplayEmptyCache: allocator.empty_cache(); break;
      default: run_pool_op(allocator, op); break;
    }
  }
};

}  // namespace

size_t traced_ring_entries(size_t count, size_t start) {
  return start < count ? kTracedEntriesPerOp * (count - start) + kTracedRingSlack : kTracedRingSlack;
}

TracedReplay replay_traced(CachingAllocator& allocator, const ReplayOp* ops, size_t count, size_t start) {
  check_kinds(ops, count, kind_bit(kReplayAlloc) | kind_bit(kReplayFree) | kind_bit(kReplayEmptyCache) | kPoolKinds,
              "0 alloc, 1 free, 2 empty_cache, 4-6 captured pools");
  TracedReplayer r{allocator, {}};
  r.result.live.reserve(1024);
  for (size_t i = 0; i < count; ++i) {
    if (i == start) allocator.start_trace(traced_ring_entries(count, start));
    r.run(ops[i], i >= start);
  }
  if (start >= count) allocator.start_trace(traced_ring_entries(count, start));
  return std::move(r.result);
}

}  // namespace amem
