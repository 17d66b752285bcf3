// backend.h — the only way the policy core reaches memory.
//
// Design note
// -----------
// The caching allocator decides *which* bytes serve a request; a Backend only
// hands out and takes back whole segments, and orders work between streams
// with events. Three implementations (csrc/backends/):
//   cuda — real device memory through the CUDA runtime, and expandable
//          segments through the driver's virtual memory API (the only files
//          that call CUDA; they resolve CUDA at run time, so nothing here
//          links against it);
//   host — real host memory (mmap), so CPU tests can write into blocks;
//   sim  — addresses only, touching no memory, so a trace with an 80 GB peak
//          replays on a small machine.
// A backend belongs to one device and is called under that device's allocator
// lock, so implementations need no locking of their own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "page_layout.h"

namespace amem {

using StreamId = uint64_t;  // a cudaStream_t's value; 0 is the default stream
using EventId = uint64_t;   // an opaque handle owned by the backend

struct DeviceMemoryInfo {
  size_t free_bytes = 0;   // what the device could still hand out
  size_t total_bytes = 0;  // the device's (or the simulated limit's) capacity
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual const char* name() const = 0;
  // A new segment of exactly `bytes`, or 0 when the device is out of memory.
  virtual uintptr_t allocate_segment(size_t bytes) = 0;
  // Gives back a segment obtained from allocate_segment.
  virtual void release_segment(uintptr_t address, size_t bytes) = 0;
  virtual DeviceMemoryInfo memory_info() = 0;

  // Stream ordering, for blocks used on streams other than their own. The
  // event belongs to the stream's device, which may not be the backend's.
  virtual EventId record_event(StreamId stream) = 0;
  virtual bool event_completed(EventId event) = 0;
  // Blocks until the work before `event` has finished.
  virtual void wait_event(EventId event) = 0;
  virtual void destroy_event(EventId event) = 0;
  // Waits for all work on the device (before memory goes back to it).
  virtual void synchronize() = 0;
  // Makes later work on `stream` wait until `event` completed, without blocking
  // the host (cudaStreamWaitEvent). Host and sim run no device work: nothing to order.
  virtual void stream_wait_event(StreamId stream, EventId event) {}

  // Note [capture mode]: the cuda backend makes every call that allocates,
  // frees, maps or unmaps device memory with the calling thread switched to
  // relaxed stream-capture mode (torch: cudaMallocMaybeCapturing), so a CUDA
  // graph being captured in global mode, on this thread or another, is not
  // invalidated by it. Synchronizing calls (synchronize, wait_event,
  // event_completed) are never legal during a capture: the allocator must not
  // make them while one is under way.

  // Expandable segments (torch's expandable_segments:True): reserve a range of
  // addresses once, then back pages of it with memory on demand. A backend that
  // cannot do this says so in supports_expandable(); the allocator then refuses
  // the option with a clear error rather than pretending.
  virtual bool supports_expandable() const { return false; }
  // Why not, for the error message, when supports_expandable() is false.
  virtual std::string why_not_expandable() const { return std::string("the ") + name() + " backend cannot map pages"; }
  // `bytes` of address space with no memory behind it, or 0 if none is left.
  // The range is mapped and unmapped in whole pages as `pages` lays them out
  // (`bytes` ends on a page boundary): a page is never split between two
  // map_pages calls or unmapped in part.
  virtual uintptr_t reserve_address_range(size_t bytes, const PageLayout& pages) { return 0; }
  virtual void release_address_range(uintptr_t address, size_t bytes) {}
  // Backs [address, address + bytes) with memory; false when out of memory.
  virtual bool map_pages(uintptr_t address, size_t bytes) { return false; }
  // Returns the memory behind [address, address + bytes); the addresses stay reserved.
  virtual void unmap_pages(uintptr_t address, size_t bytes) {}
};

// How the cuda backend makes its device current for a call and gives the
// caller's device back (Note [switching devices] in cuda_backend.cpp). With
// both null it uses the runtime's cudaGetDevice / cudaSetDevice. The backend
// never looks for torch itself: the bindings hand torch's own pair down when
// torch is loaded (csrc/bind/torch_devices.h).
struct DeviceSwitchFns {
  int8_t (*exchange)(int8_t device) = nullptr;  // makes `device` current; returns the caller's
  int (*maybe_set)(int8_t device) = nullptr;    // gives the caller's device back; returns a cudaError_t
};

// limit_bytes: the capacity of a host or sim device (0 = unlimited for sim,
// physical memory for host). device: the CUDA device index.
std::unique_ptr<Backend> make_host_backend(size_t limit_bytes);
std::unique_ptr<Backend> make_sim_backend(size_t limit_bytes);
std::unique_ptr<Backend> make_cuda_backend(int device, DeviceSwitchFns switch_fns = {});
// Devices the CUDA runtime sees (throws BackendError without a runtime).
int cuda_device_count();

}  // namespace amem
