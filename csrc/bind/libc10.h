// libc10.h — symbols from the libc10 torch has loaded, found at run time.
//
// amem links against nothing from torch (one build serves every torch from
// 2.11 on), yet three of torch's behaviours need torch's own code: raising
// torch.OutOfMemoryError (torch_oom.h), feeding the profiler's memory events
// (torch_profiler.h) and switching devices as torch's CUDAGuard does
// (torch_devices.h, handed down to the cuda backend). Each takes exported, ABI-stable
// symbols from torch's libraries already in the process (never loading one of
// our own) and falls back to amem's own behaviour when a symbol is missing.
#pragma once

namespace amem {

// The address of `mangled` in the loaded libc10, or nullptr.
void* libc10_symbol(const char* mangled);
// The address of `mangled` in torch's already loaded library `soname` (e.g.
// "libtorch_cuda.so"), or nullptr when the library is not loaded or lacks it.
void* torch_library_symbol(const char* soname, const char* mangled);

}  // namespace amem
