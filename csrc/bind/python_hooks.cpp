// python_hooks.cpp — see python_hooks.h.
#include "python_hooks.h"

#include <atomic>
#include <cstdio>

namespace py = pybind11;

namespace amem {
namespace {

// Leaked on purpose: a py::object destroyed after the interpreter is gone crashes.
std::atomic<py::object*> g_stack_capturer{nullptr};
std::atomic<py::object*> g_oom_callback{nullptr};

void replace(std::atomic<py::object*>& slot, py::object fn) {
  py::object* fresh = fn.is_none() ? nullptr : new py::object(std::move(fn));
  py::object* old = slot.exchange(fresh);
  delete old;  // we hold the GIL here (called from Python)
}

}  // namespace

void set_stack_capturer(py::object fn) { replace(g_stack_capturer, std::move(fn)); }
void set_oom_callback(py::object fn) { replace(g_oom_callback, std::move(fn)); }

uint32_t capture_python_context() {
  if (g_stack_capturer.load(std::memory_order_relaxed) == nullptr || !Py_IsInitialized()) return 0;
  py::gil_scoped_acquire gil;
  py::object* fn = g_stack_capturer.load();
  if (fn == nullptr) return 0;
  try {
    return (*fn)().cast<uint32_t>();
  } catch (py::error_already_set& err) {
    err.discard_as_unraisable("amem stack capture");
    return 0;
  }
}

void notify_oom(int device) {
  if (g_oom_callback.load(std::memory_order_relaxed) == nullptr || !Py_IsInitialized()) return;
  py::gil_scoped_acquire gil;
  py::object* fn = g_oom_callback.load();
  if (fn == nullptr) return;
  try {
    (*fn)(device);
  } catch (py::error_already_set& err) {
    err.discard_as_unraisable("amem out-of-memory callback");
  }
}

}  // namespace amem
