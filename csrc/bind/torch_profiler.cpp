// torch_profiler.cpp — see torch_profiler.h.
#include "torch_profiler.h"

#include <mutex>

#include "libc10.h"

namespace amem {
namespace {

struct Device {  // c10::Device
  int8_t type;   // c10::DeviceType
  int8_t index;  // c10::DeviceIndex
};
constexpr int8_t kCudaDeviceType = 1;  // c10::DeviceType::CUDA

using EnabledFn = bool (*)();
using ReportFn = void (*)(void* ptr, int64_t alloc_size, size_t total_allocated, size_t total_reserved,
                          Device device);

struct ProfilerHooks {
  EnabledFn enabled = nullptr;
  ReportFn report = nullptr;
};

const ProfilerHooks& hooks() {
  static ProfilerHooks h;
  static std::once_flag once;
  std::call_once(once, [] {
    auto enabled = reinterpret_cast<EnabledFn>(libc10_symbol("_ZN3c1022memoryProfilingEnabledEv"));
    auto report = reinterpret_cast<ReportFn>(libc10_symbol("_ZN3c1027reportMemoryUsageToProfilerEPvlmmNS_6DeviceE"));
    if (enabled != nullptr && report != nullptr) h = {enabled, report};
  });
  return h;
}

}  // namespace

bool profiler_hooks_available() { return hooks().enabled != nullptr; }

bool profiler_wants_memory() {
  const ProfilerHooks& h = hooks();
  return h.enabled != nullptr && h.enabled();
}

void report_to_profiler(void* ptr, int64_t bytes, int64_t total_allocated, int64_t total_reserved, int device) {
  const ProfilerHooks& h = hooks();
  if (h.report == nullptr) return;
  h.report(ptr, bytes, static_cast<size_t>(total_allocated), static_cast<size_t>(total_reserved),
           Device{kCudaDeviceType, static_cast<int8_t>(device)});
}

}  // namespace amem
