// cuda_runtime_abi.h — the few CUDA runtime types and values the cuda backend uses.
//
// Design note
// -----------
// These are part of libcudart's stable C ABI (driver_types.h / cuda_runtime_api.h,
// unchanged from CUDA 11 to 13): opaque stream and event handles, an int-sized
// error code, and a handful of constants. Declaring them here lets the cuda
// backend compile with no CUDA toolkit at all; where a toolkit's header is
// present, cuda_abi_check.cpp checks every value below against it at compile
// time (CMakeLists.txt finds it via CUDA_HOME, CUDA_PATH or /usr/local/cuda).
#pragma once

#include <cstddef>

namespace amem::cudart {

using Error = int;                    // cudaError_t (an enum of int size)
using Stream = struct CUstream_st*;   // cudaStream_t
using Event = struct CUevent_st*;     // cudaEvent_t

constexpr Error kSuccess = 0;                  // cudaSuccess
constexpr Error kErrorMemoryAllocation = 2;    // cudaErrorMemoryAllocation
constexpr Error kErrorNotReady = 600;          // cudaErrorNotReady
constexpr unsigned kEventDisableTiming = 0x02; // cudaEventDisableTiming
constexpr int kStreamCaptureModeRelaxed = 2;   // cudaStreamCaptureModeRelaxed

using MallocFn = Error (*)(void**, size_t);
using FreeFn = Error (*)(void*);
using MemGetInfoFn = Error (*)(size_t*, size_t*);
using GetDeviceFn = Error (*)(int*);
using SetDeviceFn = Error (*)(int);
using GetDeviceCountFn = Error (*)(int*);
using EventCreateWithFlagsFn = Error (*)(Event*, unsigned);
using EventRecordFn = Error (*)(Event, Stream);
using EventQueryFn = Error (*)(Event);
using EventDestroyFn = Error (*)(Event);
using StreamWaitEventFn = Error (*)(Stream, Event, unsigned);
using EventSynchronizeFn = Error (*)(Event);
using DeviceSynchronizeFn = Error (*)();
using ThreadExchangeStreamCaptureModeFn = Error (*)(int*);  // cudaStreamCaptureMode* (an int-sized enum)
using StreamGetDeviceFn = Error (*)(Stream, int*);           // CUDA 12.8+; optional
using GetLastErrorFn = Error (*)();
using GetErrorStringFn = const char* (*)(Error);

}  // namespace amem::cudart
