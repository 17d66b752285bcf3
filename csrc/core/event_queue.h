// event_queue.h — deferred frees: blocks waiting on stream events.
//
// Design note
// -----------
// A block that other streams used (record_stream) is not reusable when its
// owner frees it: an event is recorded on each of those streams and the block
// stays pending until every event has completed (Note [record_stream] in
// caching_allocator.h). The queue keeps, per stream, its events in record
// order. A stream runs its work in order, so a stream's queue is checked only
// up to its first unfinished event: O(streams) per poll, not O(pending events)
// (torch does the same).
//
// The queue owns the events given to it and destroys each once it completed
// (or was waited for, or at destruction). It calls `on_ready(block)` for a block whose
// last event completed; what "ready" means (free the block, hand it to another
// stream) is the allocator's policy.
#pragma once

#include <deque>
#include <map>
#include <utility>

#include "backend.h"
#include "block.h"

namespace amem {

class EventQueue {
 public:
  explicit EventQueue(Backend& backend) : backend_(backend) {}
  EventQueue(const EventQueue&) = delete;
  EventQueue& operator=(const EventQueue&) = delete;
  ~EventQueue() {
    for (auto& [stream, queue] : pending_)
      for (auto& [event, block] : queue) backend_.destroy_event(event);
  }

  bool empty() const { return pending_.empty(); }

  // `event`, recorded on `stream`, is one that `block` waits for; the queue owns it now.
  void add(StreamId stream, EventId event, Block* block) {
    pending_[stream].emplace_back(event, block);
    block->pending_events += 1;
  }

  // Completes the events that have finished, in each stream's order.
  template <typename OnReady>
  void poll(OnReady on_ready) {
    for (auto it = pending_.begin(); it != pending_.end();) {
      auto& queue = it->second;
      while (!queue.empty() && backend_.event_completed(queue.front().first)) {
        auto [event, block] = queue.front();
        queue.pop_front();
        complete(event, block, on_ready);
      }
      it = queue.empty() ? pending_.erase(it) : std::next(it);
    }
  }

  // Waits for every pending event (the host blocks on each; the rest of the
  // device runs on), then completes them all. Nothing pending: nothing waits.
  template <typename OnReady>
  void wait_all(OnReady on_ready) {
    for (auto& [stream, queue] : pending_) {
      for (auto& [event, block] : queue) {
        backend_.wait_event(event);
        complete(event, block, on_ready);
      }
    }
    pending_.clear();
  }

 private:
  template <typename OnReady>
  void complete(EventId event, Block* block, OnReady& on_ready) {
    backend_.destroy_event(event);
    if (--block->pending_events == 0) on_ready(block);
  }

  Backend& backend_;
  std::map<StreamId, std::deque<std::pair<EventId, Block*>>> pending_;  // per stream, in record order
};

}  // namespace amem
