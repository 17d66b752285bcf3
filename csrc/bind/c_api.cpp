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
// Errors: amem_malloc lets the core's exceptions propagate (after telling the
// Python OOM callback, if one is installed: python_hooks.h); torch turns a C++
// exception from the plugin into a Python RuntimeError carrying our message.
// amem_free must never throw (torch calls it from deleters that cannot), so a
// bad free is counted in the device's stats (num_invalid_frees) and reported
// on stderr instead, and the allocator's state stays untouched.
#include <cstdint>
#include <cstdio>

#include "device_registry.h"
#include "python_hooks.h"

using amem::registry_device;
using amem::registry_existing;
using amem::StreamId;

namespace {

StreamId stream_id(void* stream) { return static_cast<StreamId>(reinterpret_cast<uintptr_t>(stream)); }

void report_free_error(const char* what) {
  static int reported = 0;
  if (reported++ < 10) std::fprintf(stderr, "%s\n", what);
}

}  // namespace

#define AMEM_API __attribute__((visibility("default")))

extern "C" {

AMEM_API void* amem_malloc(size_t size, int device, void* stream) {
  if (size == 0) return nullptr;  // Note [size 0] in caching_allocator.h
  amem::set_thread_trace_context(amem::capture_python_context());  // before any allocator lock
  try {
    uintptr_t address = registry_device(device).malloc(size, stream_id(stream));
    return reinterpret_cast<void*>(address);
  } catch (const amem::OutOfMemoryError&) {
    amem::notify_oom(device);  // always-on mode writes the trace before torch sees the error
    throw;
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
    a->free(reinterpret_cast<uintptr_t>(ptr));
  } catch (const std::exception& e) {
    report_free_error(e.what());
  }
}

// torch's init hook: called with the device count when torch initializes CUDA.
AMEM_API void amem_init(int /*device_count*/) {}

// torch's reset hook, called by torch.cuda.empty_cache(): every device we serve.
AMEM_API void amem_empty_cache() {
  for (int d : amem::registry_devices_in_use()) registry_device(d).empty_cache();
}

}  // extern "C"
