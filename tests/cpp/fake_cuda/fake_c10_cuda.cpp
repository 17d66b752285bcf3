// fake_c10_cuda.cpp — torch's device switching (libc10_cuda.so), over the fake
// runtime, for the cuda backend's tests (see fake_cuda.h). The same semantics
// as c10/cuda/CUDAFunctions.cpp (torch 2.11–2.14): a thread-local target device
// stands in for a device that has no context yet, so restoring the caller's
// device never creates one. The symbols carry torch's mangled names
// (DeviceIndex is int8_t), which is how the backend finds them.
#include <cstdint>

#include "fake_cuda.h"

extern "C" int cudaGetDevice(int* device);
extern "C" int cudaSetDevice(int device);

namespace c10::cuda {

namespace {
thread_local int8_t target_device = -1;  // torch's targetDeviceIndex
}

bool hasPrimaryContext(int8_t device) { return fake_cuda_has_context(device); }

int8_t ExchangeDevice(int8_t to_device) {
  int8_t current = target_device;
  target_device = -1;
  if (current < 0) {
    int device = -1;
    cudaGetDevice(&device);
    current = static_cast<int8_t>(device);
    if (to_device == current) return current;
  }
  cudaSetDevice(to_device);
  return current;
}

int MaybeSetDevice(int8_t device) {
  if (!hasPrimaryContext(device)) {
    target_device = device;
    return 0;
  }
  target_device = -1;
  int current = -1;
  cudaGetDevice(&current);
  return current == device ? 0 : cudaSetDevice(device);
}

}  // namespace c10::cuda

extern "C" int fake_c10_current_device() {
  if (c10::cuda::target_device >= 0) return c10::cuda::target_device;
  int device = -1;
  cudaGetDevice(&device);
  return device;
}
