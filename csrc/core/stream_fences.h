// stream_fences.h — when may a block freed on one stream serve another?
//
// Design note
// -----------
// Note [cross-stream reuse]: torch reuses a free block only on the stream it
// was allocated for, because work queued on that stream before the free may
// still read or write it. With cross_stream_reuse on, every free marks a
// fence: (the stream it was used on, that stream's free count). A block keeps
// the fences of every piece merged into it, and its split remainders copy
// them. A request on stream R may take a block when each fence on a stream
// other than R is passed:
//
//   wait      each mark records an event on its stream (one cudaEventRecord
//             per free, no sync); a fence is passed once its event, or a later
//             one of the same stream, completed (a stream runs in order).
//             A block whose fences are not passed is skipped.
//   handover  marks record nothing; taking the block records one event on each
//             foreign fence's stream and makes R wait on it
//             (cudaStreamWaitEvent: no host sync, but R waits for all that
//             stream's work queued so far, not only the work before the free).
//
// StreamFences owns the events of the wait mode and destroys each once it
// completed. Which blocks carry which fences, and when a block may serve
// another stream, is CrossStreamReuse's (cross_stream_reuse.h), its one user.
// It is called under the allocator's lock.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <utility>
#include <vector>

#include "backend.h"

namespace amem {

struct Fence {
  StreamId stream = 0;  // where the block was used
  uint64_t seq = 0;     // that stream's mark count when it was freed
};

class StreamFences {
 public:
  StreamFences(Backend& backend, bool record) : backend_(backend), record_(record) {}
  StreamFences(const StreamFences&) = delete;
  StreamFences& operator=(const StreamFences&) = delete;
  ~StreamFences() {
    for (auto& [stream, s] : streams_)
      for (auto& [seq, event] : s.events) backend_.destroy_event(event);
  }

  // A block used on `stream` was freed now. During graph capture no event is
  // recorded (Note [private pools]): the fence then passes with the stream's
  // next completed event, or at a synchronize.
  Fence mark(StreamId stream, bool may_record = true) {
    PerStream& s = streams_[stream];
    const uint64_t seq = ++s.marked;
    if (record_ && may_record) s.events.emplace_back(seq, backend_.record_event(stream));
    return {stream, seq};
  }

  // Whether the work before the fence's free has finished (wait mode).
  bool passed(const Fence& f) {
    auto it = streams_.find(f.stream);
    if (it == streams_.end()) return true;
    PerStream& s = it->second;
    while (s.done < f.seq && !s.events.empty() && backend_.event_completed(s.events.front().second)) {
      s.done = s.events.front().first;
      backend_.destroy_event(s.events.front().second);
      s.events.pop_front();
    }
    return s.done >= f.seq;
  }

  // Makes `consumer` wait for the work queued so far on `producer` (handover mode).
  void hand_over(StreamId producer, StreamId consumer) {
    EventId e = backend_.record_event(producer);
    backend_.stream_wait_event(consumer, e);
    backend_.destroy_event(e);
  }

  // The device was synchronized: every fence is passed.
  void synchronized() {
    for (auto& [stream, s] : streams_) {
      for (auto& [seq, event] : s.events) backend_.destroy_event(event);
      s.events.clear();
      s.done = s.marked;
    }
  }

 private:
  struct PerStream {
    uint64_t marked = 0;  // fences marked
    uint64_t done = 0;    // fences known passed
    std::deque<std::pair<uint64_t, EventId>> events;  // (seq, event), in record order
  };
  Backend& backend_;
  bool record_;
  std::map<StreamId, PerStream> streams_;
};

}  // namespace amem
