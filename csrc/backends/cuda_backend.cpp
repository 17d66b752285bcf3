// cuda_backend.cpp — segments in real device memory. With cuda_pages.cpp
// (expandable segments, through the driver), the only code in amem that calls CUDA.
//
// Design note
// -----------
// The few runtime types we need are declared in cuda_runtime_abi.h (checked
// against a toolkit header where one exists), and the functions are resolved
// at run time from the libcudart that torch has already loaded (RTLD_NOLOAD),
// falling back to the loader's search path. So the extension links against
// nothing from CUDA, builds on a machine with no GPU and no driver, and shares
// torch's runtime (same contexts, same streams) when it runs. Nothing here is
// touched until the first CUDA allocation.
//
// Every call runs with the backend's device made current and the caller's
// device restored afterwards (DeviceGuard, Note [switching devices]); every call that allocates, frees,
// maps or unmaps runs with the thread in relaxed stream-capture mode
// (RelaxedCapture; Note [capture mode] in backend.h). An out-of-memory from cudaMalloc is
// reported as 0, with CUDA's sticky error cleared; any other CUDA error throws
// BackendError with CUDA's own message.
#include <dlfcn.h>

#include <cstdint>
#include <exception>
#include <mutex>
#include <string>

#include "../core/backend.h"
#include "../core/errors.h"
#include "cuda_pages.h"
#include "cuda_runtime_abi.h"

namespace amem {
namespace {

using cudart::Error;

// ---------------------------------------------------------------- the runtime's functions

struct CudaRuntime {
  cudart::MallocFn malloc = nullptr;
  cudart::FreeFn free = nullptr;
  cudart::MemGetInfoFn mem_get_info = nullptr;
  cudart::GetDeviceFn get_device = nullptr;
  cudart::SetDeviceFn set_device = nullptr;
  cudart::GetDeviceCountFn get_device_count = nullptr;
  cudart::EventCreateWithFlagsFn event_create = nullptr;
  cudart::EventRecordFn event_record = nullptr;
  cudart::EventQueryFn event_query = nullptr;
  cudart::EventDestroyFn event_destroy = nullptr;
  cudart::StreamWaitEventFn stream_wait_event = nullptr;
  cudart::EventSynchronizeFn event_synchronize = nullptr;
  cudart::DeviceSynchronizeFn device_synchronize = nullptr;
  cudart::ThreadExchangeStreamCaptureModeFn exchange_capture_mode = nullptr;
  cudart::StreamGetDeviceFn stream_get_device = nullptr;  // null before CUDA 12.8
  cudart::GetLastErrorFn get_last_error = nullptr;
  cudart::GetErrorStringFn error_string = nullptr;

  static const CudaRuntime& get();
};

void* open_cudart() {
  static const char* const names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
                                      "libcudart.so"};
  for (const char* name : names)  // torch's own copy first
    if (void* h = dlopen(name, RTLD_NOW | RTLD_NOLOAD)) return h;
  for (const char* name : names)
    if (void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL)) return h;
  throw BackendError(
      "amem cuda backend: the CUDA runtime (libcudart) is not loaded and could not be found; "
      "import torch (a CUDA build) before allocating, or use backend='host' or 'sim' on a "
      "machine without a GPU");
}

template <typename Fn>
void resolve(void* lib, Fn& fn, const char* symbol) {
  fn = reinterpret_cast<Fn>(dlsym(lib, symbol));
  if (fn == nullptr)
    throw BackendError(std::string("amem cuda backend: libcudart has no ") + symbol);
}

const CudaRuntime& CudaRuntime::get() {
  static CudaRuntime rt;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = open_cudart();
    resolve(lib, rt.malloc, "cudaMalloc");
    resolve(lib, rt.free, "cudaFree");
    resolve(lib, rt.mem_get_info, "cudaMemGetInfo");
    resolve(lib, rt.get_device, "cudaGetDevice");
    resolve(lib, rt.set_device, "cudaSetDevice");
    resolve(lib, rt.get_device_count, "cudaGetDeviceCount");
    resolve(lib, rt.event_create, "cudaEventCreateWithFlags");
    resolve(lib, rt.event_record, "cudaEventRecord");
    resolve(lib, rt.event_query, "cudaEventQuery");
    resolve(lib, rt.event_destroy, "cudaEventDestroy");
    resolve(lib, rt.stream_wait_event, "cudaStreamWaitEvent");
    resolve(lib, rt.event_synchronize, "cudaEventSynchronize");
    resolve(lib, rt.device_synchronize, "cudaDeviceSynchronize");
    resolve(lib, rt.exchange_capture_mode, "cudaThreadExchangeStreamCaptureMode");
    rt.stream_get_device = reinterpret_cast<cudart::StreamGetDeviceFn>(dlsym(lib, "cudaStreamGetDevice"));
    resolve(lib, rt.get_last_error, "cudaGetLastError");
    resolve(lib, rt.error_string, "cudaGetErrorString");
  });
  return rt;
}

void check(const CudaRuntime& rt, Error err, const char* what) {
  if (err == cudart::kSuccess) return;
  rt.get_last_error();  // clear the sticky error so the process can go on
  throw BackendError(std::string("amem cuda backend: ") + what + " failed: " + rt.error_string(err));
}

// Note [switching devices]
// ~~~~~~~~~~~~~~~~~~~~~~~~~
// Since CUDA 12, cudaSetDevice creates the device's primary context (hundreds of
// MiB of device memory) when it has none. A thread that never used GPU 0 still
// has 0 as its current device, so freeing GPU 1's memory from it and then
// restoring 0 with cudaSetDevice would create a context on GPU 0 that the user
// never asked for. torch's CUDAGuard avoids this with ExchangeDevice on entry and
// MaybeSetDevice on exit: a device without a context becomes torch's
// thread-local "target" device instead of the runtime's current one, and torch's
// current_device() reports it. When torch is loaded the backend switches devices
// with those same two functions (exported by libc10_cuda.so, torch 2.11–2.14, with
// DeviceIndex an int8_t), so torch's view of the thread's device stays right and
// no context appears; without torch it uses cudaGetDevice / cudaSetDevice. The
// backend does not look for torch: whoever makes it hands the pair down
// (DeviceSwitchFns in backend.h; the bindings find it in csrc/bind/torch_devices.cpp).
class DeviceSwitch {
 public:
  // torch's pair when both are given, else the runtime's own calls.
  DeviceSwitch(const CudaRuntime& rt, DeviceSwitchFns torch) : rt_(rt) {
    if (torch.exchange != nullptr && torch.maybe_set != nullptr) torch_ = torch;
  }

  // Makes `device` current; returns the caller's device.
  int exchange(int device) const {
    if (torch_.exchange != nullptr) return torch_exchange(device);
    int previous = -1;
    check(rt_, rt_.get_device(&previous), "cudaGetDevice");
    if (previous != device) check(rt_, rt_.set_device(device), "cudaSetDevice");
    return previous;
  }
  // Gives the caller's device back (never throws: it runs in destructors).
  void restore(int device) const {
    if (torch_.maybe_set != nullptr) torch_.maybe_set(static_cast<int8_t>(device));
    else rt_.set_device(device);
  }

 private:
  // torch reports a failed cudaSetDevice as a c10::Error; amem's callers expect BackendError.
  int torch_exchange(int device) const {
    try {
      return torch_.exchange(static_cast<int8_t>(device));
    } catch (const std::exception& e) {
      rt_.get_last_error();
      throw BackendError(std::string("amem cuda backend: making device ") + std::to_string(device) +
                         " current failed: " + e.what());
    }
  }

  const CudaRuntime& rt_;
  DeviceSwitchFns torch_;  // c10::cuda::ExchangeDevice and MaybeSetDevice, or both null
};

// Makes `device` current for a scope and gives the caller's device back.
class DeviceGuard {
 public:
  DeviceGuard(const DeviceSwitch& devices, int device) : devices_(devices), previous_(devices.exchange(device)) {
    if (previous_ == device) previous_ = -1;
  }
  ~DeviceGuard() {
    if (previous_ >= 0) devices_.restore(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  const DeviceSwitch& devices_;
  int previous_;  // -1: the device was already current
};

// Switches this thread to relaxed stream-capture mode for a scope and restores
// its mode (torch: CUDAStreamCaptureModeGuard in cudaMallocMaybeCapturing).
class RelaxedCapture {
 public:
  explicit RelaxedCapture(const CudaRuntime& rt) : rt_(rt) {
    check(rt_, rt_.exchange_capture_mode(&mode_), "cudaThreadExchangeStreamCaptureMode");
  }
  ~RelaxedCapture() { rt_.exchange_capture_mode(&mode_); }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  const CudaRuntime& rt_;
  int mode_ = cudart::kStreamCaptureModeRelaxed;  // holds the caller's mode while the scope lasts
};

// The device `stream` belongs to: the default stream is the current device's;
// without cudaStreamGetDevice (CUDA < 12.8) assume `fallback`.
int stream_device(const CudaRuntime& rt, cudart::Stream stream, int fallback) {
  if (stream == nullptr || rt.stream_get_device == nullptr) return fallback;
  int device = fallback;
  check(rt, rt.stream_get_device(stream, &device), "cudaStreamGetDevice");
  return device;
}

// ---------------------------------------------------------------- the backend

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, DeviceSwitchFns switch_fns)
      : rt_(CudaRuntime::get()), devices_(rt_, switch_fns), device_(device) {
    int count = 0;
    check(rt_, rt_.get_device_count(&count), "cudaGetDeviceCount");
    if (device < 0 || device >= count)
      throw std::invalid_argument("amem: CUDA device " + std::to_string(device) +
                                  " does not exist; this process sees " + std::to_string(count) +
                                  " device(s) (indices 0.." + std::to_string(count - 1) + ")");
    open_pages();
  }

  const char* name() const override { return "cuda"; }

  // Expandable segments (cuda_pages.h): there when the driver and the device can map pages.
  bool supports_expandable() const override { return pages_ != nullptr; }
  std::string why_not_expandable() const override { return no_pages_why_; }

  uintptr_t reserve_address_range(size_t bytes, const PageLayout& layout) override {
    DeviceGuard guard(devices_, device_);
    RelaxedCapture relaxed(rt_);
    return pages().reserve(bytes, layout);
  }
  void release_address_range(uintptr_t address, size_t bytes) override {
    DeviceGuard guard(devices_, device_);
    RelaxedCapture relaxed(rt_);
    pages().release(address, bytes);
  }
  bool map_pages(uintptr_t address, size_t bytes) override {
    DeviceGuard guard(devices_, device_);
    RelaxedCapture relaxed(rt_);
    return pages().map(address, bytes);
  }
  void unmap_pages(uintptr_t address, size_t bytes) override {
    DeviceGuard guard(devices_, device_);
    RelaxedCapture relaxed(rt_);
    pages().unmap(address, bytes);
  }

  uintptr_t allocate_segment(size_t bytes) override {
    DeviceGuard guard(devices_, device_);
    RelaxedCapture relaxed(rt_);
    void* p = nullptr;
    Error err = rt_.malloc(&p, bytes);
    if (err == cudart::kErrorMemoryAllocation) {
      rt_.get_last_error();  // an OOM is an answer, not a failure: clear it
      return 0;
    }
    check(rt_, err, "cudaMalloc");
    return reinterpret_cast<uintptr_t>(p);
  }

  void release_segment(uintptr_t address, size_t) override {
    DeviceGuard guard(devices_, device_);
    RelaxedCapture relaxed(rt_);
    check(rt_, rt_.free(reinterpret_cast<void*>(address)), "cudaFree");
  }

  DeviceMemoryInfo memory_info() override {
    DeviceGuard guard(devices_, device_);
    RelaxedCapture relaxed(rt_);
    size_t free_bytes = 0, total_bytes = 0;
    check(rt_, rt_.mem_get_info(&free_bytes, &total_bytes), "cudaMemGetInfo");
    return {free_bytes, total_bytes};
  }

  // The event is created on the stream's own device, as CUDA requires (torch: insert_events).
  EventId record_event(StreamId stream) override {
    auto s = reinterpret_cast<cudart::Stream>(stream);
    DeviceGuard guard(devices_, stream_device(rt_, s, device_));
    cudart::Event event = nullptr;
    check(rt_, rt_.event_create(&event, cudart::kEventDisableTiming), "cudaEventCreateWithFlags");
    Error err = rt_.event_record(event, s);
    if (err != cudart::kSuccess) rt_.event_destroy(event);  // nothing left behind
    check(rt_, err, "cudaEventRecord");
    return reinterpret_cast<EventId>(event);
  }

  void wait_event(EventId event) override {
    check(rt_, rt_.event_synchronize(reinterpret_cast<cudart::Event>(event)), "cudaEventSynchronize");
  }

  bool event_completed(EventId event) override {
    Error err = rt_.event_query(reinterpret_cast<cudart::Event>(event));
    if (err == cudart::kErrorNotReady) {
      rt_.get_last_error();
      return false;
    }
    check(rt_, err, "cudaEventQuery");
    return true;
  }

  void destroy_event(EventId event) override {
    check(rt_, rt_.event_destroy(reinterpret_cast<cudart::Event>(event)), "cudaEventDestroy");
  }

  // cross_stream_reuse:handover: later work on `stream` waits for `event` (no host sync).
  void stream_wait_event(StreamId stream, EventId event) override {
    DeviceGuard guard(devices_, stream_device(rt_, reinterpret_cast<cudart::Stream>(stream), device_));
    check(rt_, rt_.stream_wait_event(reinterpret_cast<cudart::Stream>(stream), reinterpret_cast<cudart::Event>(event), 0),
          "cudaStreamWaitEvent");
  }

  void synchronize() override {
    DeviceGuard guard(devices_, device_);
    check(rt_, rt_.device_synchronize(), "cudaDeviceSynchronize");
  }

 private:
  CudaPages& pages() {
    if (pages_ == nullptr) throw BackendError("amem cuda backend: no expandable segments: " + no_pages_why_);
    return *pages_;
  }
  void open_pages() {
    DeviceGuard guard(devices_, device_);
    try {
      pages_ = CudaPages::open(device_, &no_pages_why_);
    } catch (const BackendError& e) {
      no_pages_why_ = e.what();
    }
  }

  const CudaRuntime& rt_;
  DeviceSwitch devices_;  // how the device is made current (Note [switching devices])
  int device_;
  std::unique_ptr<CudaPages> pages_;  // null when the driver or device cannot map pages
  std::string no_pages_why_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device, DeviceSwitchFns switch_fns) {
  return std::make_unique<CudaBackend>(device, switch_fns);
}

int cuda_device_count() {
  int count = 0;
  const CudaRuntime& rt = CudaRuntime::get();
  check(rt, rt.get_device_count(&count), "cudaGetDeviceCount");
  return count;
}

}  // namespace amem
