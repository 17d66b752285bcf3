// fake_cuda.h — a stand-in for the CUDA runtime and driver, for testing the
// cuda backend on machines without a GPU. Not a test file itself.
//
// Design note
// -----------
// Two small shared libraries carry the sonames the cuda backend dlopens,
// libcudart.so.13 (fake_cudart.cpp) and libcuda.so.1 (fake_cuda.cpp), and the
// test executable links both, so the backend finds them already loaded, as it
// finds torch's copies in a real process. They implement only what the
// backend calls, with the rules that matter to it: a per-device capacity
// (cudaMalloc and cuMemCreate answer out-of-memory past it, and the runtime's
// error is sticky until cudaGetLastError), a current device per thread,
// events that stay incomplete while their stream is marked busy, and the
// virtual memory API's constraints (a mapping lies in a reserved range, is
// unmapped whole, and a range is freed only when nothing is mapped in it).
// Breaking a rule returns an error code and counts a violation, which the
// tests assert is zero. No memory is touched: addresses come from reserved,
// inaccessible host address space.
//
// Stream capture (CUDA graphs) follows CUDA's rules: while a stream captures,
// "potentially unsafe" calls (cudaMalloc, cudaFree, cudaMemGetInfo, event
// queries, the virtual memory API) are refused with
// cudaErrorStreamCaptureUnsupported — and every capture they conflict with is
// invalidated, so its cudaStreamEndCapture fails — when the calling thread's
// capture mode forbids them (cudaThreadExchangeStreamCaptureMode): global
// mode forbids them while this thread captures in a non-relaxed mode or any
// thread captures in global mode; thread-local mode only for this thread's
// own non-relaxed captures; relaxed mode never. cudaDeviceSynchronize is
// refused during any capture, whatever the mode.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

struct FakeCudaCounts {
  size_t allocations = 0;       // live cudaMalloc blocks
  size_t handles = 0;           // live cuMemCreate handles
  size_t mappings = 0;          // live cuMemMap mappings
  size_t mappings_without_access = 0;  // mapped but never given to cuMemSetAccess
  size_t ranges = 0;            // live cuMemAddressReserve ranges
  size_t events = 0;            // live events
  size_t stream_waits = 0;      // cudaStreamWaitEvent calls
  size_t used_bytes[2] = {};    // per device: cudaMalloc + cuMemCreate
  size_t violations = 0;        // calls that broke the API's rules (see above)
  int sticky_error = 0;         // the runtime's pending error
  size_t capture_refusals = 0;  // calls refused because a capture forbade them
  size_t invalidated_captures = 0;  // captures ended by such a call
};

// Resets everything: 2 devices of `capacity` bytes each, virtual memory supported.
void fake_cuda_reset(size_t capacity);
FakeCudaCounts fake_cuda_counts();
// The next call to `function` (e.g. "cudaMalloc", "cuMemMap") returns `code`.
void fake_cuda_fail_next(const char* function, int code);
// The call to `function` after the next `skip` ones returns `code`.
void fake_cuda_fail_after(const char* function, int skip, int code);
void fake_cuda_set_stream_busy(uint64_t stream, bool busy);
void fake_cuda_set_vmm_supported(bool supported);
// Whether the two devices can reach each other's memory (cuDeviceCanAccessPeer; default: yes).
void fake_cuda_set_peer_access(bool peers);
// The devices given access (cuMemSetAccess) to the mapped page holding `address`: bit d for device d.
unsigned fake_cuda_page_readers(uintptr_t address);
// Whether `consumer` was made to wait (cudaStreamWaitEvent) on an event recorded on `producer`.
bool fake_cuda_waited(uint64_t consumer, uint64_t producer);
// Stream `stream` belongs to `device` (cudaStreamGetDevice; default: device 0).
void fake_cuda_set_stream_device(uint64_t stream, int device);
// Whether `device` has a primary context: since CUDA 12, cudaSetDevice creates one,
// as does any runtime call that works on the current device (cudaMalloc, events...).
bool fake_cuda_has_context(int device);
// torch's idea of the calling thread's device (c10::cuda::current_device), from the
// fake libc10_cuda.so (fake_c10_cuda.cpp).
int fake_c10_current_device();
// An unrecoverable ("sticky") error: every runtime call fails with `code` from now on (0 clears).
void fake_cuda_set_fatal_error(int code);

// Shared with fake_cudart.cpp (internal).
bool fake_cuda_take_failure(const char* function, int* code);
bool fake_cuda_charge(int device, size_t bytes);
void fake_cuda_refund(int device, size_t bytes);
int fake_cuda_device_count();
void fake_cuda_note_context(int device);
size_t fake_cuda_capacity();
void fake_cuda_finish_all_work();  // no stream is busy any more
void fake_cuda_note_violation();
bool fake_cuda_stream_busy(uint64_t stream);
size_t* fake_cuda_live_counter(const char* what);  // "allocations" or "events"
int* fake_cuda_sticky_error();
void fake_cuda_note_wait(uint64_t consumer, uint64_t producer);
// 0 when the calling thread may make a potentially unsafe call now; else the
// error to answer (the conflicting captures are invalidated). `sync`: the call
// waits for the device, which no capture allows.
int fake_cuda_capture_check(bool sync);
int fake_cuda_stream_device(uint64_t stream);
int fake_cuda_fatal_error();
int fake_cuda_begin_capture(uint64_t stream, int mode);
int fake_cuda_end_capture(uint64_t stream);
bool fake_cuda_stream_capturing(uint64_t stream);
int fake_cuda_exchange_capture_mode(int mode);  // returns the thread's previous mode
}
