// python_hooks.h — the two places the C++ side calls back into Python.
//
// Design note
// -----------
// 1. Stack capture: when recording with stacks="python", the bindings call a
//    Python function before each allocation and store the small id it returns
//    as the calling thread's trace context (trace.h). It runs *before* the
//    allocator's lock is taken, so a thread waiting for the GIL never holds the
//    allocator lock (no lock-order deadlock with threads holding the GIL).
// 2. Out of memory: in always-on mode (AMEM_TRACE), a Python function is called
//    with the device index when a CUDA allocation fails, before the error goes
//    back to torch, so the trace of the crash is written to disk.
// Both are off (one relaxed atomic load) unless Python installs a function.
// Python errors inside them are printed, never propagated into torch.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>

namespace amem {

void set_stack_capturer(pybind11::object fn);  // None disables
// The context id for the next allocation on this thread (0 when stacks are off).
// Acquires the GIL itself; call it without holding any allocator lock.
uint32_t capture_python_context();

void set_oom_callback(pybind11::object fn);  // None disables
void notify_oom(int device);

}  // namespace amem
