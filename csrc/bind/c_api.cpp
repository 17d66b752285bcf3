// c_api.cpp — the C entry points torch's CUDAPluggableAllocator calls.
//
// Design note
// -----------
// The only code that knows torch's calling convention
// (torch/csrc/cuda/CUDAPluggableAllocator.h): alloc is
// void*(size_t, int device, cudaStream_t) and free is
// void(void*, size_t, int device, cudaStream_t). cudaStream_t is a pointer, so
// it is taken as void* here and this file needs no CUDA header.
//
// Errors: out of memory becomes torch's own c10::OutOfMemoryError (Note
// [raising torch.OutOfMemoryError] in torch_oom.h), after the Python OOM
// callback, if any, has run (python_hooks.h). Other core exceptions propagate; torch turns a C++
// exception from the plugin into a Python RuntimeError carrying our message.
// amem_free must never throw (torch calls it from deleters that cannot), so a
// bad free is counted in the device's stats (num_invalid_frees) and reported
// on stderr instead, and the allocator's state stays untouched.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <utility>

#include "../backends/cuda_runtime_abi.h"
#include "device_registry.h"
#include "python_hooks.h"
#include "torch_oom.h"
#include "torch_profiler.h"

using amem::registry_device;
using amem::registry_existing;
using amem::StreamId;

namespace {

// torch's c10::cuda::MempoolId_t and the stream filter of beginAllocateToPool;
// the same types, so the function-pointer signatures torch casts to match ours.
using MempoolId = std::pair<unsigned long long, unsigned long long>;
using StreamFilter = std::function<bool(amem::cudart::Stream)>;

amem::PoolId pool_id(MempoolId id) { return {id.first, id.second}; }

StreamId stream_id(void* stream) { return static_cast<StreamId>(reinterpret_cast<uintptr_t>(stream)); }

// torch.profiler(profile_memory=True): what the native allocator reports (torch_profiler.h).
// The block's size when this thread is being profiled, else 0 (and no lookup at all).
int64_t profiled_bytes(const amem::CachingAllocator& a, uintptr_t address) {
  if (!amem::profiler_wants_memory()) return 0;
  return static_cast<int64_t>(a.block_info(address).size);
}

void report_to_profiler(amem::CachingAllocator& a, uintptr_t address, int64_t bytes, int device) {
  auto figures = a.figures();
  amem::report_to_profiler(reinterpret_cast<void*>(address), bytes, figures.allocated, figures.reserved, device);
}

void report_free_error(const char* what) {
  static std::atomic<int> reported{0};  // frees come from any thread
  if (reported.fetch_add(1, std::memory_order_relaxed) < 10) std::fprintf(stderr, "%s\n", what);
}

}  // namespace

#define AMEM_API __attribute__((visibility("default")))

extern "C" {

AMEM_API void* amem_malloc(size_t size, int device, void* stream) {
  if (size == 0) return nullptr;  // Note [size 0] in caching_allocator.h
  amem::set_thread_trace_context(amem::capture_python_context());  // before any allocator lock
  try {
    amem::CachingAllocator& a = registry_device(device);
    uintptr_t address = a.malloc(size, stream_id(stream));
    amem::set_thread_trace_context(0);  // the context belongs to this allocation only
    if (int64_t bytes = profiled_bytes(a, address)) report_to_profiler(a, address, bytes, device);
    return reinterpret_cast<void*>(address);
  } catch (const amem::OutOfMemoryError& oom) {
    amem::set_thread_trace_context(0);
    amem::notify_oom(device);          // always-on mode writes the trace before torch sees the error
    amem::throw_torch_oom(oom.what());  // torch.OutOfMemoryError in Python (torch_oom.h)
    throw;                              // libc10 not found: amem's own error (a RuntimeError)
  }
}

AMEM_API void amem_free(void* ptr, size_t /*size*/, int device, void* /*stream*/) {
  if (ptr == nullptr) return;
  try {
    amem::CachingAllocator* a = registry_existing(device);
    if (a == nullptr) {
      report_free_error("amem: free on a CUDA device that never allocated through amem; ignored");
      return;
    }
    auto address = reinterpret_cast<uintptr_t>(ptr);
    int64_t bytes = profiled_bytes(*a, address);  // read before the block is gone
    a->free(address);
    if (bytes > 0) report_to_profiler(*a, address, -bytes, device);
  } catch (const std::exception& e) {
    report_free_error(e.what());
  }
}

// torch's record_stream hook (tensor.record_stream(s)): the block is not reused
// until the work queued on `stream` so far has finished (Note [record_stream]).
AMEM_API void amem_record_stream(void* ptr, void* stream) {
  if (ptr == nullptr) return;  // an empty tensor: nothing to order (Note [size 0])
  int device = amem::registry_owner(reinterpret_cast<uintptr_t>(ptr));
  if (device < 0) {
    report_free_error("amem: record_stream on a pointer amem does not hold; ignored");
    return;
  }
  registry_device(device).record_stream(reinterpret_cast<uintptr_t>(ptr), stream_id(stream));
}

// torch's memory-fraction hook (torch.cuda.set_per_process_memory_fraction).
AMEM_API void amem_set_memory_fraction(double fraction, int device) {
  registry_device(device).set_memory_fraction(fraction);
}

// Tests only: throws torch's OutOfMemoryError through whatever torch entry
// point calls it (installed as the reset hook, torch._C._cuda_emptyCache()
// shows the exception type torch's own bindings produce, on a CPU).
AMEM_API void amem_selftest_throw_oom() {
  amem::throw_torch_oom("amem self-test: out of memory raised through torch's bindings");
  throw std::runtime_error("amem self-test: libc10 not found; torch.OutOfMemoryError unavailable");
}

// torch's private-pool hooks (CUDA graph capture, MemPool): Note [private pools].
AMEM_API void amem_begin_allocate_to_pool(int device, MempoolId id, StreamFilter filter) {
  registry_device(device).begin_allocate_to_pool(pool_id(id), [filter = std::move(filter)](StreamId s) {
    return filter(reinterpret_cast<amem::cudart::Stream>(s));
  });
}

AMEM_API void amem_end_allocate_to_pool(int device, MempoolId id) {
  registry_device(device).end_allocate_to_pool(pool_id(id));
}

AMEM_API void amem_release_pool(int device, MempoolId id) {
  if (amem::CachingAllocator* a = registry_existing(device)) a->release_pool(pool_id(id));
}

// torch's init hook: called with the device count when torch initializes CUDA.
AMEM_API void amem_init(int /*device_count*/) {}

// torch's reset hook, called by torch.cuda.empty_cache(): every device we serve.
AMEM_API void amem_empty_cache() {
  for (int d : amem::registry_devices_in_use()) registry_device(d).empty_cache();
}

}  // extern "C"
