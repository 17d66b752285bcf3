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
static_assert(std::is_same_v<decltype(&cudaGetErrorString), const char* (*)(cudaError_t)>, "signature");
static_assert(std::is_same_v<decltype(&cudaMalloc), cudaError_t (*)(void**, size_t)>, "signature");
static_assert(std::is_same_v<decltype(&cudaEventRecord), cudaError_t (*)(cudaEvent_t, cudaStream_t)>, "signature");
static_assert(std::is_same_v<decltype(&cudaEventCreateWithFlags), cudaError_t (*)(cudaEvent_t*, unsigned)>,
              "signature");
