// torch_profiler.h — report amem's allocations to torch.profiler.
//
// torch.profiler(profile_memory=True) learns about allocations only from the
// allocator itself: the native one calls c10::reportMemoryUsageToProfiler on
// every malloc and free when c10::memoryProfilingEnabled() says the calling
// thread is being profiled. A pluggable allocator's wrapper does not, so amem
// does it: both functions are exported by libc10 and found at run time
// (libc10.h); c10::Device is a two-byte {type, index} value. Without libc10 the
// calls are skipped. The cost when nobody profiles is one call per malloc/free.
#pragma once

#include <cstdint>

namespace amem {

bool profiler_hooks_available();
bool profiler_wants_memory();
// bytes > 0 for an allocation, < 0 for a free; totals are the device's figures after it.
void report_to_profiler(void* ptr, int64_t bytes, int64_t total_allocated, int64_t total_reserved,
                        int device);

}  // namespace amem
