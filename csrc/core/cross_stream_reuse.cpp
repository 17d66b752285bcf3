// cross_stream_reuse.cpp — see cross_stream_reuse.h and Note [cross-stream
// reuse] in stream_fences.h.
#include "cross_stream_reuse.h"

#include <algorithm>

namespace amem {

// ================================================================ frees

void CrossStreamReuse::add_fence(Block* block, Fence fence) {
  for (Fence& f : block->fences) {
    if (f.stream != fence.stream) continue;
    f.seq = std::max(f.seq, fence.seq);
    return;
  }
  block->fences.push_back(fence);
}

// ================================================================ requests

bool CrossStreamReuse::reusable_by(const Block* block, StreamId stream) {
  for (const Fence& f : block->fences) {
    if (f.stream == stream) continue;             // its own stream orders itself
    if (pools_.capturing()) return false;         // no events during capture (Note [private pools])
    if (mode_ == CrossStream::kHandover) continue;  // ordered when taken
    if (!fences_.passed(f)) return false;
  }
  return true;
}

// One lower_bound per other stream.
Block* CrossStreamReuse::find_foreign(BlockPool& pool, StreamId stream, size_t rounded) {
  constexpr int kMaxSkips = 8;  // blocks not yet reusable looked past, per stream
  Block* best = nullptr;
  for (auto at = pool.free_blocks.begin(); at != pool.free_blocks.end();) {
    const StreamId s = at->stream;
    if (s != stream) {
      auto it = pool.lower_bound(s, rounded);
      for (int skips = 0; it != pool.free_blocks.end() && it->stream == s && skips < kMaxSkips; ++it, ++skips) {
        if (!reusable_by(it->block, stream)) continue;
        if (within_oversize_rules(it->block->size, rounded, options_) && (best == nullptr || it->size < best->size))
          best = it->block;
        break;
      }
    }
    if (s == UINT64_MAX) break;
    at = pool.lower_bound(s + 1, 0);  // the next stream's first entry
  }
  return best;
}

void CrossStreamReuse::settle(Block* block, StreamId stream) {
  if (mode_ == CrossStream::kHandover) {
    std::vector<StreamId> waited;
    for (const Fence& f : block->fences) {
      if (f.stream == stream || std::find(waited.begin(), waited.end(), f.stream) != waited.end()) continue;
      fences_.hand_over(f.stream, stream);
      waited.push_back(f.stream);
    }
  }
  block->fences.clear();
}

}  // namespace amem
