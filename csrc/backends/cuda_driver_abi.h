// cuda_driver_abi.h — the few CUDA driver types, values and functions the cuda
// backend's expandable segments use (the virtual memory management API).
//
// Design note
// -----------
// As with the runtime (cuda_runtime_abi.h), these are declared here so the
// backend builds with no CUDA toolkit, and resolved at run time from the
// libcuda the runtime has loaded. They are part of the driver's stable C ABI
// (cuda.h, CUDA 10.2 to 13); where a toolkit header is present,
// cuda_abi_check.cpp checks every declaration below against it at compile time.
#pragma once

#include <cstddef>

namespace amem::cudrv {

using Result = int;                    // CUresult (an enum of int size)
using DevicePtr = unsigned long long;  // CUdeviceptr on 64-bit hosts
using Handle = unsigned long long;     // CUmemGenericAllocationHandle
using Device = int;                    // CUdevice

struct Location {  // CUmemLocation
  int type = 0;    // CUmemLocationType
  int id = 0;      // the device ordinal for a device location
};

struct AllocationProp {  // CUmemAllocationProp
  int type = 0;                    // CUmemAllocationType
  int requested_handle_types = 0;  // CUmemAllocationHandleType
  Location location;
  void* win32_handle_metadata = nullptr;
  struct {
    unsigned char compression_type = 0;
    unsigned char gpu_direct_rdma_capable = 0;
    unsigned short usage = 0;
    unsigned char reserved[4] = {};
  } alloc_flags;
};

struct AccessDesc {  // CUmemAccessDesc
  Location location;
  int flags = 0;     // CUmemAccess_flags
};

constexpr Result kSuccess = 0;                 // CUDA_SUCCESS
constexpr Result kErrorOutOfMemory = 2;        // CUDA_ERROR_OUT_OF_MEMORY
constexpr int kAllocationTypePinned = 0x1;     // CU_MEM_ALLOCATION_TYPE_PINNED
constexpr int kLocationTypeDevice = 0x1;       // CU_MEM_LOCATION_TYPE_DEVICE
constexpr int kAccessReadWrite = 0x3;          // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
constexpr int kGranularityMinimum = 0x0;       // CU_MEM_ALLOC_GRANULARITY_MINIMUM
constexpr int kAttributeVirtualMemory = 102;   // CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED

using DeviceGetFn = Result (*)(Device*, int);
using DeviceGetAttributeFn = Result (*)(int*, int, Device);
using DeviceGetCountFn = Result (*)(int*);
using DeviceCanAccessPeerFn = Result (*)(int*, Device, Device);  // (can, dev, peer): dev reads peer's memory
using GetErrorStringFn = Result (*)(Result, const char**);
using MemGetAllocationGranularityFn = Result (*)(size_t*, const AllocationProp*, int);
using MemAddressReserveFn = Result (*)(DevicePtr*, size_t, size_t, DevicePtr, unsigned long long);
using MemAddressFreeFn = Result (*)(DevicePtr, size_t);
using MemCreateFn = Result (*)(Handle*, size_t, const AllocationProp*, unsigned long long);
using MemReleaseFn = Result (*)(Handle);
using MemMapFn = Result (*)(DevicePtr, size_t, size_t, Handle, unsigned long long);
using MemUnmapFn = Result (*)(DevicePtr, size_t);
using MemSetAccessFn = Result (*)(DevicePtr, size_t, const AccessDesc*, size_t);

}  // namespace amem::cudrv
