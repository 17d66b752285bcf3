// replay.h — drive an allocator through a recorded sequence of requests.
//
// Design note
// -----------
// A replay program is a flat array of operations: allocate `size` bytes on
// `stream` for the block known as `key` (in a trace, the address the original
// allocator returned), free the block known as `key`, empty the cache (a trace
// shows the native allocator releasing its cache there), or mark the end of the
// prologue (the ops before it rebuild the state a trace started in; peaks and
// the timeline count from here), or open, close or release a private pool
// (CUDA graph capture, Note [captured pools]). The loop maps keys to
// the addresses *this* allocator returns, so any policy can replay any trace.
// It runs in C++ because traces have millions of events; Python only parses
// the trace and reads the result. With record_segments it also returns the
// segment events each op caused (from the end of the prologue on), which is
// all a fidelity check needs: there is no second, step-by-step engine. A
// prediction's trace is the same loop with the event ring on (replay_traced,
// Note [traced replay]), for the same reason: its programs have millions of ops.
//
// Out of memory does not stop a replay: the request is counted as failed, its
// later free is skipped, and the run goes on — that is the answer to "would
// this workload have fit?". Frees of unknown keys are counted, not fatal
// (a trace can start mid-run; callers pre-allocate such blocks, see
// amem_alloc/replay.py).
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "caching_allocator.h"

namespace amem {

struct ReplayOp {
  uint64_t key = 0;     // the block's identity in the trace
  uint64_t size = 0;    // bytes requested (alloc only)
  StreamId stream = 0;  // stream of the request (alloc only)
  uint64_t kind = 0;    // ReplayKind (64-bit: the record is 32 bytes, no padding)
};

enum ReplayKind : uint64_t {
  kReplayAlloc = 0,
  kReplayFree = 1,
  kReplayEmptyCache = 2,
  kReplayPrologueEnd = 3,
  // Note [captured pools]: a CUDA graph capture into private pool `key`: every request between
  // begin and end is served from that pool (torch: beginAllocateToPool with the capture's
  // stream filter; every stream a captured program uses joins its capture), and a release
  // says the pool's graphs are gone (torch: releasePool).
  kReplayBeginPool = 4,
  kReplayEndPool = 5,
  kReplayReleasePool = 6,
};
static_assert(sizeof(ReplayOp) == 32, "ReplayOp is a packed 32-byte record shared with Python");

struct ReplaySample {
  uint64_t op = 0;         // index of the operation after which the figures were taken
  int64_t allocated = 0;   // bytes
  int64_t reserved = 0;    // bytes
};

struct ReplayResult {
  uint64_t ops = 0, allocs = 0, frees = 0;
  uint64_t failed_allocs = 0;    // out of memory
  uint64_t unknown_frees = 0;    // a free of a key that is not live
  uint64_t duplicate_allocs = 0; // an alloc of a key that is already live (the old block is freed first)
  uint64_t releases = 0;         // empty_cache ops
  int64_t prologue_end = -1;     // index of the prologue-end op, or -1
  int64_t peak_allocated = 0, peak_reserved = 0;
  std::vector<ReplaySample> samples;  // the timeline, at most max_samples points plus the peaks
  // With record_segments: every segment event after the prologue, with the
  // index of the op that caused it (the native allocator's decisions are
  // compared with these, amem_alloc/compare/fidelity.py).
  std::vector<SegmentEvent> segment_events;
};

// Replays `ops` through `allocator`; `max_samples` bounds the timeline.
// Throws std::invalid_argument, before running anything, if an op has an unknown kind.
ReplayResult replay(CachingAllocator& allocator, const ReplayOp* ops, size_t count, size_t max_samples,
                    bool record_segments = false);

// ---------------------------------------------------------------- the traced replay

// Note [traced replay]: a prediction's trace (amem_alloc/replay/traced.py) is
// its program re-run on a fresh allocator with the event ring on from op
// `start` (a record window's start); the snapshot is then built from the ring
// and the segments. The caller labels each alloc event with the key that made
// it, so the replay hands back the keys of the allocations made from `start`
// on, in order (the n-th alloc event of the ring is the n-th of them), and the
// keys still live at the end with their addresses. Its rules are the ones that
// trace has always had:
//  * an alloc of a live key frees the old block first (as replay() does);
//  * a free of a key that is not live is ignored;
//  * a malloc that returns 0 (size 0, Note [size 0]) makes nothing live and
//    records nothing;
//  * out of memory and bad requests end the replay: the error reaches the
//    caller (a trace of a run that could not run is no answer);
//  * the ring holds kTracedEntriesPerOp entries per op from `start` on plus
//    kTracedRingSlack, so nothing is dropped; with `start` at or past the end
//    it is started, with the slack alone, after the last op.
// Its ops are alloc, free, empty_cache and a captured pool's begin, end and
// release (run as replay() runs them, Note [captured pools]); there is no
// prologue to mark.
struct TracedReplay {
  std::vector<uint64_t> order;                   // keys of the allocations from `start` on, in order
  std::unordered_map<uint64_t, uintptr_t> live;  // key -> address of each block live at the end
};

constexpr size_t kTracedEntriesPerOp = 4;   // alloc/free and the segment events they cause
constexpr size_t kTracedRingSlack = 4096;   // ring entries beyond those

// The ring's size for a traced replay of `count` ops recording from `start`.
size_t traced_ring_entries(size_t count, size_t start);

// Replays `ops` through `allocator` with its trace started before op `start`.
// Throws std::invalid_argument, before running anything, if an op's kind is
// the end of a prologue or unknown.
TracedReplay replay_traced(CachingAllocator& allocator, const ReplayOp* ops, size_t count, size_t start);

}  // namespace amem
