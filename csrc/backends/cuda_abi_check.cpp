// cuda_abi_check.cpp — compile-time proof that cuda_runtime_abi.h matches the
// CUDA toolkit's own header. Built only where a toolkit header exists; it
// generates no code.
#include <cuda_runtime_api.h>

#include <type_traits>

#include "cuda_runtime_abi.h"

namespace c = amem::cudart;

static_assert(sizeof(cudaError_t) == sizeof(c::Error), "cudaError_t is not int-sized");
static_assert(std::is_same_v<cudaStream_t, c::Stream>, "cudaStream_t differs");
static_assert(std::is_same_v<cudaEvent_t, c::Event>, "cudaEvent_t differs");
static_assert(cudaSuccess == c::kSuccess, "cudaSuccess differs");
static_assert(cudaErrorMemoryAllocation == c::kErrorMemoryAllocation, "cudaErrorMemoryAllocation differs");
static_assert(cudaErrorNotReady == c::kErrorNotReady, "cudaErrorNotReady differs");
static_assert(cudaEventDisableTiming == c::kEventDisableTiming, "cudaEventDisableTiming differs");
static_assert(cudaStreamCaptureModeRelaxed == c::kStreamCaptureModeRelaxed, "cudaStreamCaptureModeRelaxed differs");
static_assert(sizeof(cudaStreamCaptureMode) == sizeof(int), "cudaStreamCaptureMode is not int-sized");
static_assert(std::is_same_v<decltype(&cudaThreadExchangeStreamCaptureMode), cudaError_t (*)(cudaStreamCaptureMode*)>,
              "signature");
static_assert(std::is_same_v<decltype(&cudaEventSynchronize), cudaError_t (*)(cudaEvent_t)>, "signature");
static_assert(std::is_same_v<decltype(&cudaGetErrorString), const char* (*)(cudaError_t)>, "signature");
static_assert(std::is_same_v<decltype(&cudaMalloc), cudaError_t (*)(void**, size_t)>, "signature");
static_assert(std::is_same_v<decltype(&cudaEventRecord), cudaError_t (*)(cudaEvent_t, cudaStream_t)>, "signature");
static_assert(std::is_same_v<decltype(&cudaStreamWaitEvent), cudaError_t (*)(cudaStream_t, cudaEvent_t, unsigned)>,
              "signature");
static_assert(std::is_same_v<decltype(&cudaEventCreateWithFlags), cudaError_t (*)(cudaEvent_t*, unsigned)>,
              "signature");

// ---------------------------------------------------------------- the driver (cuda_driver_abi.h)

#include <cuda.h>

#include <cstddef>

#include "cuda_driver_abi.h"

namespace d = amem::cudrv;

static_assert(sizeof(CUresult) == sizeof(d::Result) && CUDA_SUCCESS == d::kSuccess, "CUresult differs");
static_assert(CUDA_ERROR_OUT_OF_MEMORY == d::kErrorOutOfMemory, "CUDA_ERROR_OUT_OF_MEMORY differs");
static_assert(std::is_same_v<CUdeviceptr, d::DevicePtr>, "CUdeviceptr differs");
static_assert(std::is_same_v<CUmemGenericAllocationHandle, d::Handle>, "CUmemGenericAllocationHandle differs");
static_assert(std::is_same_v<CUdevice, d::Device>, "CUdevice differs");
static_assert(CU_MEM_ALLOCATION_TYPE_PINNED == d::kAllocationTypePinned, "allocation type differs");
static_assert(CU_MEM_LOCATION_TYPE_DEVICE == d::kLocationTypeDevice, "location type differs");
static_assert(CU_MEM_ACCESS_FLAGS_PROT_READWRITE == d::kAccessReadWrite, "access flags differ");
static_assert(CU_MEM_ALLOC_GRANULARITY_MINIMUM == d::kGranularityMinimum, "granularity flag differs");
static_assert(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED == d::kAttributeVirtualMemory, "attribute differs");
static_assert(sizeof(CUmemLocationType) == sizeof(int) && sizeof(CUmemAllocationType) == sizeof(int) &&
              sizeof(CUmemAllocationHandleType) == sizeof(int) && sizeof(CUmemAccess_flags) == sizeof(int),
              "an enum is not int-sized");
static_assert(sizeof(CUmemLocation) == sizeof(d::Location) && offsetof(CUmemLocation, id) == offsetof(d::Location, id),
              "CUmemLocation differs");
static_assert(sizeof(CUmemAllocationProp) == sizeof(d::AllocationProp) &&
              offsetof(CUmemAllocationProp, requestedHandleTypes) == offsetof(d::AllocationProp, requested_handle_types) &&
              offsetof(CUmemAllocationProp, location) == offsetof(d::AllocationProp, location) &&
              offsetof(CUmemAllocationProp, win32HandleMetaData) == offsetof(d::AllocationProp, win32_handle_metadata) &&
              offsetof(CUmemAllocationProp, allocFlags) == offsetof(d::AllocationProp, alloc_flags),
              "CUmemAllocationProp differs");
static_assert(sizeof(CUmemAccessDesc) == sizeof(d::AccessDesc) && offsetof(CUmemAccessDesc, flags) == offsetof(d::AccessDesc, flags),
              "CUmemAccessDesc differs");
// The signatures the function types in cuda_driver_abi.h transcribe (enums there are ints).
static_assert(std::is_same_v<decltype(&cuDeviceGet), CUresult (*)(CUdevice*, int)>, "signature");
static_assert(std::is_same_v<decltype(&cuDeviceGetAttribute), CUresult (*)(int*, CUdevice_attribute, CUdevice)>, "signature");
static_assert(std::is_same_v<decltype(&cuDeviceGetCount), CUresult (*)(int*)>, "signature");
static_assert(std::is_same_v<decltype(&cuDeviceCanAccessPeer), CUresult (*)(int*, CUdevice, CUdevice)>, "signature");
static_assert(std::is_same_v<decltype(&cuGetErrorString), CUresult (*)(CUresult, const char**)>, "signature");
static_assert(std::is_same_v<decltype(&cuMemGetAllocationGranularity),
                             CUresult (*)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags)>, "signature");
static_assert(std::is_same_v<decltype(&cuMemAddressReserve),
                             CUresult (*)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long)>, "signature");
static_assert(std::is_same_v<decltype(&cuMemAddressFree), CUresult (*)(CUdeviceptr, size_t)>, "signature");
static_assert(std::is_same_v<decltype(&cuMemCreate), CUresult (*)(CUmemGenericAllocationHandle*, size_t,
                                                                  const CUmemAllocationProp*, unsigned long long)>, "signature");
static_assert(std::is_same_v<decltype(&cuMemRelease), CUresult (*)(CUmemGenericAllocationHandle)>, "signature");
static_assert(std::is_same_v<decltype(&cuMemMap), CUresult (*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                                                               unsigned long long)>, "signature");
static_assert(std::is_same_v<decltype(&cuMemUnmap), CUresult (*)(CUdeviceptr, size_t)>, "signature");
static_assert(std::is_same_v<decltype(&cuMemSetAccess), CUresult (*)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t)>,
              "signature");
