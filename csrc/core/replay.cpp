// replay.cpp — the replay loop (see replay.h).
#include "replay.h"

#include <unordered_map>

namespace amem {
namespace {

struct Replayer {
  CachingAllocator& allocator;
  ReplayResult result;
  std::unordered_map<uint64_t, uintptr_t> live;  // trace key -> our address
  size_t sample_every = 1;

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

ReplayResult replay(CachingAllocator& allocator, const ReplayOp* ops, size_t count, size_t max_samples) {
  Replayer r{allocator, {}, {}, 1};
  r.live.reserve(1024);
  r.sample_every = max_samples > 0 ? std::max<size_t>(1, count / max_samples) : count + 1;
  for (size_t i = 0; i < count; ++i) {
    if (ops[i].kind == 0) r.alloc(ops[i]);
    else r.free(ops[i]);
    r.sample(i, i + 1 == count);
  }
  r.result.ops = count;
  return r.result;
}

}  // namespace amem
