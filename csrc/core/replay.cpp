// replay.cpp — the replay loop (see replay.h).
#include "replay.h"

#include <stdexcept>
#include <string>
#include <unordered_map>

namespace amem {
namespace {

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

  // Note [captured pools] (replay.h): while a capture is open every request goes to its pool.
  static PoolId captured_pool(const ReplayOp& op) { return {0, op.key}; }
  void begin_pool(const ReplayOp& op) {
    allocator.begin_allocate_to_pool(captured_pool(op), [](StreamId) { return true; });
  }
  void end_pool(const ReplayOp& op) { allocator.end_allocate_to_pool(captured_pool(op)); }
  void release_pool(const ReplayOp& op) { allocator.release_pool(captured_pool(op)); }

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

void check_kinds(const ReplayOp* ops, size_t count) {
  for (size_t i = 0; i < count; ++i)
    if (ops[i].kind > kReplayReleasePool)
      throw std::invalid_argument("amem: replay op " + std::to_string(i) + " has unknown kind " +
                                  std::to_string(ops[i].kind) +
                                  " (0 alloc, 1 free, 2 empty_cache, 3 end of prologue, 4-6 captured pools)");
}

ReplayResult replay(CachingAllocator& allocator, const ReplayOp* ops, size_t count, size_t max_samples,
                    bool record_segments) {
  check_kinds(ops, count);
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
      case kReplayBeginPool: r.begin_pool(ops[i]); break;
      case kReplayEndPool: r.end_pool(ops[i]); break;
      case kReplayReleasePool: r.release_pool(ops[i]); break;
      default: r.end_prologue(i); break;
    }
    r.sample(i, i + 1 == count);
    if (record_segments) r.stamp(i);
  }
  if (record_segments) allocator.set_segment_log(nullptr);
  r.result.ops = count;
  return r.result;
}

}  // namespace amem
