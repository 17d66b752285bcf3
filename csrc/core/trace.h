// trace.h — a bounded ring of allocator events.
//
// Design note
// -----------
// Each CachingAllocator owns one Trace, written under the allocator's lock, so
// recording needs no lock of its own. When recording is off the hot path pays
// one predictable branch (`if (trace_.on())`). When on, an event is a fixed
// 64-byte record copied into a preallocated ring: no allocation, no string.
// When the ring is full the oldest event is overwritten and counted in
// dropped(), which every export reports — events are never lost silently.
//
// Events are recorded where torch's allocator records them (see
// docs/torch_policy.md §8): `alloc` after a split, `free_requested` when the
// caller frees, `free_completed` when the block becomes reusable (before it
// merges), `segment_alloc`/`segment_free` around backend calls, `oom` with the
// device's free bytes in place of an address, plus amem's `empty_cache`.
//
// Two small integers tie an event to its context: `tag`, set process-wide by
// the Python side (set_trace_tag, e.g. "forward"), and `context`, set per thread
// by the bindings just before a call (e.g. the id of a captured Python stack).
#pragma once

#include <cstddef>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

#include "backend.h"

namespace amem {

#define AMEM_TRACE_ACTIONS(X) \
  X(alloc)                    \
  X(free_requested)           \
  X(free_completed)           \
  X(segment_alloc)            \
  X(segment_free)             \
  X(segment_map)              \
  X(segment_unmap)            \
  X(oom)                      \
  X(empty_cache)

enum class TraceAction : uint8_t {
#define AMEM_ACTION_ENUM(name) k_##name,
  AMEM_TRACE_ACTIONS(AMEM_ACTION_ENUM)
#undef AMEM_ACTION_ENUM
};

const char* trace_action_name(TraceAction action);

// One cache line. Its position in the whole recording (0, 1, 2, ...) is not
// stored: events are contiguous, so it follows from the ring (first_seq()).
struct alignas(64) TraceEvent {
  uint64_t ticks = 0;      // when: a cycle counter, turned into torch's time_us on export (Note [trace time])
  uintptr_t address = 0;   // block or segment address; device free bytes for oom
  uint64_t size = 0;       // requested bytes (alloc/free), segment bytes, or the rounded oom request
  uint64_t rounded = 0;    // the block's rounded size for alloc/free events
  StreamId stream = 0;     // the stream the request came from (Note [traced stream])
  uint64_t alloc_seq = 0;  // the block's allocation number (alloc and free events)
  uint32_t thread = 0;     // small per-process thread number (1, 2, ...)
  uint32_t tag = 0;        // process-wide tag at the time (0 = none)
  uint32_t context = 0;    // per-call context id, e.g. a captured stack (0 = none)
  TraceAction action = TraceAction::k_alloc;
};

// The process-wide tag and the calling thread's context id.
void set_trace_tag(uint32_t tag);
void set_thread_trace_context(uint32_t context);

// ---------------------------------------------------------------- inline: read on every recorded call

namespace trace_detail {
extern std::atomic<uint32_t> tag;
extern thread_local uint32_t context;
extern thread_local uint32_t thread_number;
uint32_t new_thread_number();
}  // namespace trace_detail

// Now, in ticks of the clock events store (Note [trace time]).
inline uint64_t read_trace_ticks() {
#if defined(__x86_64__) || defined(__i386__)
  return __rdtsc();
#else
  using namespace std::chrono;
  return static_cast<uint64_t>(duration_cast<nanoseconds>(steady_clock::now().time_since_epoch()).count());
#endif
}
inline uint32_t trace_tag() { return trace_detail::tag.load(std::memory_order_relaxed); }
inline uint32_t thread_trace_context() { return trace_detail::context; }
// The calling thread's small number (1, 2, ...), given on first use.
inline uint32_t trace_thread_number() {
  const uint32_t n = trace_detail::thread_number;
  return n != 0 ? n : trace_detail::new_thread_number();
}

// Note [trace time]: reading the wall clock costs ~36 ns here, and a
// malloc+free pair records three events, which alone made recording cost 1.7x.
// Events therefore store the CPU's time-stamp counter (~11 ns to read; a
// monotonic clock where there is none), and exports turn ticks into
// microseconds since the epoch using two (ticks, wall clock) anchors taken
// when recording starts and at export. The counter is read once per public
// call of the allocator, not per event: a free's free_requested and
// free_completed, or a malloc's segment_alloc and alloc, happen within the
// same call, under the same lock, and share its time. The allocator's Guard
// (caching_allocator.h) ends the call, so no stamp outlives it.

// Note [traced stream]: an alloc or free event carries the stream the tensor
// was requested on (Block::used_on), not the stream of the segment it came
// from. Under torch's policy they are the same; under cross_stream_reuse a
// block of one stream's segment serves another, and torch's snapshot format
// (and a replay of the trace under any policy) must see the program's stream.
// Segment events carry the segment's stream.

class Trace {
 public:
  bool on() const { return on_; }
  // Starts recording into a ring of `max_entries` (> 0); keeps earlier events
  // that still fit.
  void start(size_t max_entries);
  void stop() { on_ = false; }
  void clear();

  // Inline: with recording on, every malloc and free records.
  void record(TraceAction action, uintptr_t address, uint64_t size, uint64_t rounded,
              StreamId stream, uint64_t alloc_seq) {
    if (!stamped_) {
      stamp_ = read_trace_ticks();
      stamped_ = true;
    }
    TraceEvent& e = ring_[head_];
    if (count_ == ring_.size()) dropped_ += 1;  // overwriting the oldest event
    else count_ += 1;
    next_seq_ += 1;
    e.ticks = stamp_;
    e.address = address;
    e.size = size;
    e.rounded = rounded;
    e.stream = stream;
    e.alloc_seq = alloc_seq;
    e.thread = trace_thread_number();
    e.tag = trace_tag();
    e.context = thread_trace_context();
    e.action = action;
    head_ = head_ + 1 == ring_.size() ? 0 : head_ + 1;
  }
  // The allocator call that recorded is over: the next event reads the clock.
  void end_call() const { stamped_ = false; }

  std::vector<TraceEvent> events() const;  // oldest first
  uint64_t first_seq() const { return next_seq_ - count_; }  // the oldest held event's position
  uint64_t dropped() const { return dropped_; }
  uint64_t recorded() const { return next_seq_; }
  size_t capacity() const { return ring_.size(); }
  // {"recording":..., "max_entries":..., "recorded":..., "dropped":..., "events":[...]}
  std::string to_json() const;

 private:
  bool on_ = false;
  std::vector<TraceEvent> ring_;
  size_t head_ = 0;        // where the next event goes
  size_t count_ = 0;       // events held (<= ring_.size())
  uint64_t next_seq_ = 0;  // events ever recorded
  uint64_t dropped_ = 0;   // events overwritten because the ring was full
  uint64_t stamp_ = 0;              // this call's time (Note [trace time])
  mutable bool stamped_ = false;    // stamp_ was read during the current call
};

}  // namespace amem
