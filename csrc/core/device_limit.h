// device_limit.h — the memory fraction: a cap on reserved memory, as an
// adaptor over the device's backend.
//
// Design note
// -----------
// torch's set_per_process_memory_fraction caps what the allocator reserves at
// fraction × the device's total memory. DeviceLimit is that cap and nothing
// else, in the manner of RMM's limiting_resource_adaptor: a Backend over the
// device's own backend that forwards every call, and refuses a new segment
// that would take reserved memory past the cap (allocate_segment answers 0,
// the backend's out-of-memory answer, so the allocator's retries and its
// out-of-memory error follow as for a full device). The allocator makes every
// backend call through it, so the check is written once: admits().
//
// Reserved memory is the ledger's counter (accounting.h), which the adaptor
// reads and never keeps. An expandable segment grows by pages, yet torch
// charges a growth what a plain segment for the request would take
// (get_allocation_size, segment_size_for here): the allocator asks admits()
// with that size before it maps, and the pages then map unchecked, as in torch.
//
// Until a fraction is set, the cap admits everything. Like the backend, it is
// called under the allocator's lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "backend.h"
#include "stats.h"

namespace amem {

class DeviceLimit final : public Backend {
 public:
  // `reserved`: the allocator's reserved_bytes counter.
  DeviceLimit(Backend& upstream, const PoolStat& reserved) : upstream_(upstream), reserved_(reserved) {}
  DeviceLimit(const DeviceLimit&) = delete;
  DeviceLimit& operator=(const DeviceLimit&) = delete;

  // ------------------------------------------------------------ the cap
  // Caps reserved memory at `fraction` (in [0, 1], else std::invalid_argument)
  // of the device's total memory (torch semantics).
  void set_fraction(double fraction);
  bool capped() const { return capped_; }
  size_t allowed_bytes() const { return allowed_; }  // SIZE_MAX until capped
  // Whether `bytes` more of reserved memory stay within the cap.
  bool admits(size_t bytes) const {
    return !capped_ || static_cast<size_t>(reserved_.current()) + bytes <= allowed_;
  }

  // ------------------------------------------------------------ the backend, capped
  const char* name() const override { return upstream_.name(); }
  uintptr_t allocate_segment(size_t bytes) override { return admits(bytes) ? upstream_.allocate_segment(bytes) : 0; }

  // ------------------------------------------------------------ the backend, forwarded
  void release_segment(uintptr_t address, size_t bytes) override { upstream_.release_segment(address, bytes); }
  DeviceMemoryInfo memory_info() override { return upstream_.memory_info(); }
  EventId record_event(StreamId stream) override { return upstream_.record_event(stream); }
  bool event_completed(EventId event) override { return upstream_.event_completed(event); }
  void wait_event(EventId event) override { upstream_.wait_event(event); }
  void destroy_event(EventId event) override { upstream_.destroy_event(event); }
  void synchronize() override { upstream_.synchronize(); }
  void stream_wait_event(StreamId stream, EventId event) override { upstream_.stream_wait_event(stream, event); }
  bool supports_expandable() const override { return upstream_.supports_expandable(); }
  std::string why_not_expandable() const override { return upstream_.why_not_expandable(); }
  uintptr_t reserve_address_range(size_t bytes, const PageLayout& pages) override {
    return upstream_.reserve_address_range(bytes, pages);
  }
  void release_address_range(uintptr_t address, size_t bytes) override { upstream_.release_address_range(address, bytes); }
  bool map_pages(uintptr_t address, size_t bytes) override { return upstream_.map_pages(address, bytes); }
  void unmap_pages(uintptr_t address, size_t bytes) override { upstream_.unmap_pages(address, bytes); }

 private:
  Backend& upstream_;
  const PoolStat& reserved_;
  bool capped_ = false;
  size_t allowed_ = SIZE_MAX;  // bytes of reserved memory allowed
};

}  // namespace amem
