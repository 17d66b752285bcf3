// simulated_streams.h — stream ordering for backends without a GPU.
//
// Design note
// -----------
// On host and sim there is no device work, so an event recorded on a stream
// has completed at once — unless a test marks the stream busy, which holds
// every event recorded on it until the stream is marked idle again (or the
// allocator synchronizes). This is enough to test record_stream's deferred
// reuse on a CPU with the same core code that runs on the GPU.
#pragma once

#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "../core/backend.h"

namespace amem {

// Has its own lock: tests flip streams busy from outside the allocator's lock.
class SimulatedStreams {
 public:
  EventId record(StreamId stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    EventId id = ++next_event_;
    if (busy_.count(stream)) pending_[id] = stream;
    return id;
  }
  bool completed(EventId event) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return pending_.count(event) == 0;
  }
  void wait(EventId event) {  // its stream's work up to it is done
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.erase(event);
  }
  void destroy(EventId event) {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.erase(event);
  }
  void synchronize() {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.clear();
  }
  void set_busy(StreamId stream, bool busy) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (busy) {
      busy_.insert(stream);
      return;
    }
    busy_.erase(stream);
    for (auto it = pending_.begin(); it != pending_.end();)
      it = it->second == stream ? pending_.erase(it) : std::next(it);
  }

 private:
  mutable std::mutex mutex_;
  EventId next_event_ = 0;
  std::unordered_set<StreamId> busy_;
  std::unordered_map<EventId, StreamId> pending_;  // event -> its busy stream
};

// Host and sim share everything but where segment memory comes from.
class SimulatedBackend : public Backend {
 public:
  explicit SimulatedBackend(size_t limit_bytes) : limit_bytes_(limit_bytes) {}

  EventId record_event(StreamId stream) override { return streams_.record(stream); }
  bool event_completed(EventId event) override { return streams_.completed(event); }
  void wait_event(EventId event) override { streams_.wait(event); }
  void destroy_event(EventId event) override { streams_.destroy(event); }
  void synchronize() override { streams_.synchronize(); }
  DeviceMemoryInfo memory_info() override {
    size_t total = limit_bytes_ ? limit_bytes_ : kUnlimited;
    return {total - used_bytes_, total};
  }
  // Holds (busy) or completes (idle) the events recorded on `stream`.
  void set_stream_busy(StreamId stream, bool busy) { streams_.set_busy(stream, busy); }

 protected:
  static constexpr size_t kUnlimited = size_t{1} << 60;  // bytes; "no limit" for messages
  bool fits(size_t bytes) const {
    size_t total = limit_bytes_ ? limit_bytes_ : kUnlimited;
    return bytes <= total - used_bytes_;
  }
  size_t limit_bytes_;     // 0 = unlimited
  size_t used_bytes_ = 0;  // bytes in live segments

 private:
  SimulatedStreams streams_;
};

}  // namespace amem
