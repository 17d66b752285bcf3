// segment_events.h — where segment events go: the trace, and a replay's log.
//
// Design note
// -----------
// A segment event is a device call that changes reserved memory: a plain
// segment allocated or freed (segment_alloc, segment_free) or pages of an
// expandable segment mapped or unmapped (segment_map, segment_unmap). Each is
// written to the trace ring when recording is on (trace.h, torch's snapshot
// actions) and appended to the replay loop's log while one is set (its record
// of fidelity against torch's own decisions, replay.h). The allocator and the
// expandable segments both report theirs here, so the two sinks see every
// event in the order the device calls were made. Called under the allocator's
// lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "trace.h"

namespace amem {

// A segment event (segment_alloc/free, segment_map/unmap) for a replay's log.
struct SegmentEvent {
  TraceAction action = TraceAction::k_segment_alloc;
  uint64_t bytes = 0;
  uint64_t op = 0;  // set by the replay loop: the request that caused it
};

class SegmentEvents {
 public:
  explicit SegmentEvents(Trace& trace) : trace_(trace) {}
  SegmentEvents(const SegmentEvents&) = delete;
  SegmentEvents& operator=(const SegmentEvents&) = delete;

  void note(TraceAction action, uintptr_t address, size_t bytes, StreamId stream) {
    if (trace_.on()) trace_.record(action, address, bytes, bytes, stream, 0);
    if (log_ != nullptr) log_->push_back({action, bytes, 0});
  }
  // While set, every event is also appended to `log`; nullptr stops it.
  void set_log(std::vector<SegmentEvent>* log) { log_ = log; }

 private:
  Trace& trace_;
  std::vector<SegmentEvent>* log_ = nullptr;
};

}  // namespace amem
