// fake_cudart.cpp — the fake CUDA runtime (libcudart.so.13; see fake_cuda.h).
// Only what the cuda backend calls.
#include <sys/mman.h>

#include <cstdint>
#include <map>
#include <mutex>

#include "fake_cuda.h"

namespace {

constexpr int kInvalidValue = 1, kMemoryAllocation = 2, kInvalidDevice = 101, kInvalidResourceHandle = 400,
              kNotReady = 600, kCaptureUnsupported = 900, kCaptureInvalidated = 901;

struct Allocation { size_t bytes; int device; };
struct Event { uint64_t stream = 0; bool recorded = false; int device = 0; };

std::mutex& mutex() {
  static std::mutex m;
  return m;
}
std::map<void*, Allocation>& allocations() {
  static std::map<void*, Allocation> a;
  return a;
}
std::map<uintptr_t, Event>& events() {
  static std::map<uintptr_t, Event> e;
  return e;
}
thread_local int current_device = 0;
uintptr_t next_event = 0x1000;

// A failing call's error stays pending until cudaGetLastError, as in CUDA.
int fail(int code) {
  *fake_cuda_sticky_error() = code;
  return code;
}

// A sticky (fatal) error fails every call; else a failure the test asked for.
#define FAKE_FAILURE(name)                                        \
  do {                                                            \
    int code_ = fake_cuda_fatal_error();                          \
    if (code_ != 0 || fake_cuda_take_failure(name, &code_)) return fail(code_); \
  } while (0)

// A potentially unsafe call during a capture that forbids it (fake_cuda.h).
#define CAPTURE_CHECK(sync)                                          \
  do {                                                               \
    if (int code_ = fake_cuda_capture_check(sync)) return fail(code_); \
  } while (0)

}  // namespace

extern "C" {

int cudaMalloc(void** p, size_t bytes) {
  FAKE_FAILURE("cudaMalloc");
  fake_cuda_note_context(current_device);
  CAPTURE_CHECK(false);
  std::lock_guard<std::mutex> lock(mutex());
  if (!fake_cuda_charge(current_device, bytes)) return fail(kMemoryAllocation);
  void* q = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (q == MAP_FAILED) {
    fake_cuda_refund(current_device, bytes);
    return fail(kMemoryAllocation);
  }
  allocations()[q] = Allocation{bytes, current_device};
  *fake_cuda_live_counter("allocations") += 1;
  *p = q;
  return 0;
}

int cudaFree(void* p) {
  FAKE_FAILURE("cudaFree");
  CAPTURE_CHECK(false);
  std::lock_guard<std::mutex> lock(mutex());
  auto it = allocations().find(p);
  if (it == allocations().end()) {
    fake_cuda_note_violation();
    return fail(kInvalidValue);
  }
  munmap(p, it->second.bytes);
  fake_cuda_finish_all_work();  // cudaFree synchronizes the device
  fake_cuda_refund(it->second.device, it->second.bytes);
  allocations().erase(it);
  *fake_cuda_live_counter("allocations") -= 1;
  return 0;
}

int cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  FAKE_FAILURE("cudaMemGetInfo");
  fake_cuda_note_context(current_device);
  CAPTURE_CHECK(false);
  *total_bytes = fake_cuda_capacity();
  *free_bytes = *total_bytes - fake_cuda_counts().used_bytes[current_device];
  return 0;
}

int cudaGetDevice(int* device) {
  FAKE_FAILURE("cudaGetDevice");
  *device = current_device;
  return 0;
}

int cudaSetDevice(int device) {
  FAKE_FAILURE("cudaSetDevice");
  if (device < 0 || device >= fake_cuda_device_count()) return fail(kInvalidDevice);
  current_device = device;
  fake_cuda_note_context(device);  // CUDA 12: cudaSetDevice initializes the device
  return 0;
}

int cudaGetDeviceCount(int* count) {
  FAKE_FAILURE("cudaGetDeviceCount");
  *count = fake_cuda_device_count();
  return 0;
}

int cudaEventCreateWithFlags(void** event, unsigned flags) {
  FAKE_FAILURE("cudaEventCreateWithFlags");
  fake_cuda_note_context(current_device);
  std::lock_guard<std::mutex> lock(mutex());
  const uintptr_t id = next_event++;
  events()[id] = Event{0, false, current_device};
  *fake_cuda_live_counter("events") += 1;
  *event = reinterpret_cast<void*>(id);
  return 0;
}

int cudaEventRecord(void* event, void* stream) {
  FAKE_FAILURE("cudaEventRecord");
  std::lock_guard<std::mutex> lock(mutex());
  auto it = events().find(reinterpret_cast<uintptr_t>(event));
  if (it == events().end()) return fail(kInvalidValue);
  const auto id = reinterpret_cast<uint64_t>(stream);
  if (id != 0 && fake_cuda_stream_device(id) != it->second.device) {  // CUDA: event and stream share a device
    fake_cuda_note_violation();
    return fail(kInvalidResourceHandle);
  }
  it->second.stream = id;
  it->second.recorded = true;
  return 0;
}

int cudaEventQuery(void* event) {
  FAKE_FAILURE("cudaEventQuery");
  CAPTURE_CHECK(false);
  std::lock_guard<std::mutex> lock(mutex());
  auto it = events().find(reinterpret_cast<uintptr_t>(event));
  if (it == events().end()) return fail(kInvalidValue);
  return fake_cuda_stream_busy(it->second.stream) ? fail(kNotReady) : 0;
}

int cudaEventDestroy(void* event) {
  FAKE_FAILURE("cudaEventDestroy");
  std::lock_guard<std::mutex> lock(mutex());
  if (events().erase(reinterpret_cast<uintptr_t>(event)) == 0) return fail(kInvalidValue);
  *fake_cuda_live_counter("events") -= 1;
  return 0;
}

int cudaStreamWaitEvent(void* stream, void* event, unsigned flags) {
  FAKE_FAILURE("cudaStreamWaitEvent");
  std::lock_guard<std::mutex> lock(mutex());
  auto it = events().find(reinterpret_cast<uintptr_t>(event));
  if (it == events().end() || !it->second.recorded || flags != 0) {
    fake_cuda_note_violation();
    return fail(kInvalidValue);
  }
  fake_cuda_note_wait(reinterpret_cast<uint64_t>(stream), it->second.stream);
  return 0;
}

int cudaDeviceSynchronize() {  // all work finishes
  FAKE_FAILURE("cudaDeviceSynchronize");
  fake_cuda_note_context(current_device);
  CAPTURE_CHECK(true);
  fake_cuda_finish_all_work();
  return 0;
}

int cudaEventSynchronize(void* event) {  // the event's work finishes
  FAKE_FAILURE("cudaEventSynchronize");
  CAPTURE_CHECK(false);
  std::lock_guard<std::mutex> lock(mutex());
  auto it = events().find(reinterpret_cast<uintptr_t>(event));
  if (it == events().end()) return fail(kInvalidValue);
  fake_cuda_set_stream_busy(it->second.stream, false);
  return 0;
}

int cudaStreamBeginCapture(void* stream, int mode) {
  FAKE_FAILURE("cudaStreamBeginCapture");
  return fake_cuda_begin_capture(reinterpret_cast<uint64_t>(stream), mode);
}

int cudaStreamEndCapture(void* stream, void** graph) {
  FAKE_FAILURE("cudaStreamEndCapture");
  const int code = fake_cuda_end_capture(reinterpret_cast<uint64_t>(stream));
  *graph = code == 0 ? reinterpret_cast<void*>(0x6000) : nullptr;
  return code == 0 ? 0 : fail(code);
}

int cudaStreamIsCapturing(void* stream, int* status) {  // cudaStreamCaptureStatus: 0 none, 1 active
  FAKE_FAILURE("cudaStreamIsCapturing");
  *status = fake_cuda_stream_capturing(reinterpret_cast<uint64_t>(stream)) ? 1 : 0;
  return 0;
}

int cudaThreadExchangeStreamCaptureMode(int* mode) {
  FAKE_FAILURE("cudaThreadExchangeStreamCaptureMode");
  if (*mode < 0 || *mode > 2) return fail(kInvalidValue);
  *mode = fake_cuda_exchange_capture_mode(*mode);
  return 0;
}

int cudaStreamGetDevice(void* stream, int* device) {
  FAKE_FAILURE("cudaStreamGetDevice");
  const auto id = reinterpret_cast<uint64_t>(stream);
  *device = id == 0 ? current_device : fake_cuda_stream_device(id);
  return 0;
}

int cudaGetLastError() {
  if (int fatal = fake_cuda_fatal_error()) return fatal;  // sticky: never cleared
  int* sticky = fake_cuda_sticky_error();
  const int error = *sticky;
  *sticky = 0;
  return error;
}

const char* cudaGetErrorString(int error) {
  switch (error) {
    case 0: return "no error";
    case kInvalidValue: return "invalid argument";
    case kMemoryAllocation: return "out of memory";
    case kInvalidDevice: return "invalid device ordinal";
    case kNotReady: return "device not ready";
    case kInvalidResourceHandle: return "invalid resource handle";
    case kCaptureUnsupported: return "operation not permitted when stream is capturing";
    case kCaptureInvalidated: return "operation failed due to a previous error during capture";
    case 700: return "an illegal memory access was encountered";
    default: return "unrecognized error code";
  }
}

}  // extern "C"
