// torch_devices.h — torch's own device switching, for the cuda backend.
//
// The cuda backend makes its device current around each call and gives the
// caller's device back (Note [switching devices] in
// csrc/backends/cuda_backend.cpp). Where torch is loaded it must do so as
// torch's CUDAGuard does, with c10::cuda::ExchangeDevice and MaybeSetDevice,
// or restoring a device without a context would create one. Those live in
// torch's libc10_cuda.so, found at run time (libc10.h): the bindings look them
// up here and hand them down to the backend when they make it; the backend
// never reaches up for torch.
#pragma once

#include "../core/backend.h"

namespace amem {

// torch's ExchangeDevice and MaybeSetDevice from the loaded libc10_cuda.so
// (torch 2.11–2.14: DeviceIndex is an int8_t), or both null without it.
DeviceSwitchFns torch_device_switch();

}  // namespace amem
