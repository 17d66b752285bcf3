// module.cpp — the pybind11 module amem_alloc._C: a thin layer over the core.
//
// Everything structured crosses as JSON text (stats, segments, fragmentation,
// options), which amem_alloc parses; no Python code depends on a C++ layout.
// Core exceptions become Python exceptions of a matching kind: OutOfMemoryError
// (a MemoryError), InvalidFreeError / ConfigError / InvalidRequestError (each a
// ValueError), BackendError (a RuntimeError). Calls that may block or spin
// release the GIL so Python threads really run concurrently.
#include <pybind11/pybind11.h>
#include <algorithm>
#include <pybind11/stl.h>

#include "../backends/simulated_streams.h"
#include "../core/caching_allocator.h"
#include "../core/replay.h"
#include "device_registry.h"
#include "pickle_scan.h"
#include "python_hooks.h"
#include "torch_oom.h"
#include "torch_profiler.h"

namespace py = pybind11;
using amem::CachingAllocator;

namespace {

std::unique_ptr<amem::Backend> make_backend(const std::string& name, size_t limit_bytes) {
  if (name == "host") return amem::make_host_backend(limit_bytes);
  if (name == "sim") return amem::make_sim_backend(limit_bytes);
  if (name == "cuda")
    throw std::invalid_argument(
        "amem: backend 'cuda' is used through amem_alloc.enable(), not Allocator(); "
        "Allocator takes 'host' or 'sim'");
  throw std::invalid_argument("amem: unknown backend '" + name + "'; choose 'host' or 'sim'");
}

// Captures the Python context (stack id) with the GIL held, then allocates without it.
uintptr_t malloc_with_context(CachingAllocator& a, size_t size, amem::StreamId stream) {
  uint32_t context = amem::capture_python_context();
  py::gil_scoped_release release;
  amem::set_thread_trace_context(context);
  struct Reset {  // the context belongs to this allocation only, even if it throws
    ~Reset() { amem::set_thread_trace_context(0); }
  } reset;
  return a.malloc(size, stream);
}

std::unique_ptr<CachingAllocator> make_allocator(const std::string& backend, const std::string& conf,
                                                 size_t limit_bytes) {
  amem::Options options = amem::Options::parse(conf);
  return std::make_unique<CachingAllocator>(make_backend(backend, limit_bytes), options);
}

void set_stream_busy(CachingAllocator& a, amem::StreamId stream, bool busy) {
  auto* simulated = dynamic_cast<amem::SimulatedBackend*>(&a.backend());
  if (simulated == nullptr) throw std::invalid_argument("amem: only host and sim streams can be held busy");
  simulated->set_stream_busy(stream, busy);
}

py::tuple block_info(const CachingAllocator& a, uintptr_t address) {
  auto info = a.block_info(address);
  return py::make_tuple(info.address, info.size, info.requested, info.stream, info.alloc_seq);
}

py::list option_rows() {
  py::list rows;
  for (const auto& row : amem::option_table()) rows.append(py::make_tuple(row.name, row.default_text, row.doc));
  return rows;
}

template <typename Fn>
auto on_device(int device, Fn fn) {  // introspection of a device that may not exist yet
  CachingAllocator* a = amem::registry_existing(device);
  return a ? fn(*a) : decltype(fn(*a))();
}

// The packed 32-byte ReplayOp records of a buffer (see replay.h); `info` keeps them alive.
size_t replay_records(const py::buffer_info& info, const amem::ReplayOp** records) {
  if (info.size * info.itemsize % sizeof(amem::ReplayOp) != 0)
    throw std::invalid_argument("amem: replay ops must be packed 32-byte records (key, size, stream, kind)");
  *records = static_cast<const amem::ReplayOp*>(info.ptr);
  return static_cast<size_t>(info.size * info.itemsize) / sizeof(amem::ReplayOp);
}

py::dict run_replay(CachingAllocator& a, py::buffer ops, size_t max_samples, bool record_segments) {
  py::buffer_info info = ops.request();
  const amem::ReplayOp* records = nullptr;
  size_t count = replay_records(info, &records);
  amem::ReplayResult r;
  {
    py::gil_scoped_release release;
    r = amem::replay(a, records, count, max_samples, record_segments);
  }
  py::list samples;
  for (const auto& s : r.samples) samples.append(py::make_tuple(s.op, s.allocated, s.reserved));
  py::dict out;
  out["ops"] = r.ops, out["allocs"] = r.allocs, out["frees"] = r.frees;
  out["failed_allocs"] = r.failed_allocs, out["unknown_frees"] = r.unknown_frees;
  out["duplicate_allocs"] = r.duplicate_allocs;
  out["releases"] = r.releases, out["prologue_end"] = r.prologue_end;
  out["peak_allocated"] = r.peak_allocated, out["peak_reserved"] = r.peak_reserved;
  out["samples"] = samples;
  py::list segment_events;  // (op, action, bytes)
  for (const auto& e : r.segment_events)
    segment_events.append(py::make_tuple(e.op, amem::trace_action_name(e.action), e.bytes));
  out["segment_events"] = segment_events;
  return out;
}

// (keys allocated from `start` on, in order; {key: address} live at the end): Note [traced replay].
py::tuple run_replay_traced(CachingAllocator& a, py::buffer ops, size_t start) {
  py::buffer_info info = ops.request();
  const amem::ReplayOp* records = nullptr;
  size_t count = replay_records(info, &records);
  amem::TracedReplay r;
  {
    py::gil_scoped_release release;
    r = amem::replay_traced(a, records, count, start);
  }
  return py::make_tuple(py::cast(r.order), py::cast(r.live));
}

// Tests and tools: a private-pool scope for requests on the given streams (none given: every
// stream, as a capture that every stream of the program joins).
void begin_pool(CachingAllocator& a, amem::PoolId id, std::vector<amem::StreamId> streams) {
  a.begin_allocate_to_pool(id, [streams = std::move(streams)](amem::StreamId s) {
    return streams.empty() || std::find(streams.begin(), streams.end(), s) != streams.end();
  });
}

void bind_errors(py::module_& m) {
  py::register_exception<amem::OutOfMemoryError>(m, "OutOfMemoryError", PyExc_MemoryError);
  py::register_exception<amem::InvalidFreeError>(m, "InvalidFreeError", PyExc_ValueError);
  py::register_exception<amem::ConfigError>(m, "ConfigError", PyExc_ValueError);
  py::register_exception<amem::InvalidRequestError>(m, "InvalidRequestError", PyExc_ValueError);
  py::register_exception<amem::BackendError>(m, "BackendError", PyExc_RuntimeError);
}

void bind_allocator(py::module_& m) {
  using py::arg;
  auto nogil = py::call_guard<py::gil_scoped_release>();
  py::class_<CachingAllocator>(m, "CoreAllocator")
      .def(py::init(&make_allocator), arg("backend"), arg("conf"), arg("limit_bytes"))
      .def("malloc", &malloc_with_context, arg("size"), arg("stream"))
      .def("free", &CachingAllocator::free, arg("address"), nogil)
      .def("record_stream", &CachingAllocator::record_stream, arg("address"), arg("stream"))
      .def("empty_cache", &CachingAllocator::empty_cache, nogil)
      .def("set_memory_fraction", &CachingAllocator::set_memory_fraction, arg("fraction"))
      .def("stats_json", &CachingAllocator::stats_json)
      .def("segments_json", &CachingAllocator::segments_json)
      .def("fragmentation_json", &CachingAllocator::fragmentation_json)
      .def("reset_peak_stats", &CachingAllocator::reset_peak_stats)
      .def("reset_accumulated_stats", &CachingAllocator::reset_accumulated_stats)
      .def("check_valid", &CachingAllocator::check_valid)
      .def("block_info", &block_info, arg("address"))
      .def("set_stream_busy", &set_stream_busy, arg("stream"), arg("busy"))
      .def("replay", &run_replay, arg("ops"), arg("max_samples"), arg("record_segments") = false)
      .def("replay_traced", &run_replay_traced, arg("ops"), arg("start"))
      .def("begin_allocate_to_pool", &begin_pool, arg("pool_id"), arg("streams"))
      .def("end_allocate_to_pool", &CachingAllocator::end_allocate_to_pool, arg("pool_id"))
      .def("release_pool", &CachingAllocator::release_pool, arg("pool_id"))
      .def_property_readonly("private_pool_count", &CachingAllocator::private_pool_count)
      .def("start_trace", &CachingAllocator::start_trace, arg("max_entries"))
      .def("stop_trace", &CachingAllocator::stop_trace)
      .def("clear_trace", &CachingAllocator::clear_trace)
      .def("trace_json", &CachingAllocator::trace_json)
      .def_property_readonly("tracing", &CachingAllocator::tracing)
      .def_property_readonly("backend", &CachingAllocator::backend_name)
      .def_property_readonly("settings", [](const CachingAllocator& a) { return a.options().to_string(); });
}

void bind_policy(py::module_& m) {
  m.def("option_table", &option_rows);
  m.def("canonical_config", [](const std::string& conf) { return amem::Options::parse(conf).to_string(); });
  m.def("config_json", [](const std::string& conf) { return amem::Options::parse(conf).to_json(); });
  m.def("round_size", [](size_t size, const std::string& conf) {
    return amem::round_size(size, amem::Options::parse(conf));
  });
  m.def("segment_size", &amem::segment_size_for);
  m.def("is_small", [](size_t rounded) { return amem::pool_for(rounded) == amem::PoolKind::kSmall; });
}

void bind_recording(py::module_& m) {
  m.def("set_trace_tag", &amem::set_trace_tag, py::arg("tag"));
  m.def("trace_tag", &amem::trace_tag);
  m.def("set_stack_capturer", &amem::set_stack_capturer, py::arg("fn"));
  m.def("set_oom_callback", &amem::set_oom_callback, py::arg("fn"));
  m.def("cuda_record", &amem::registry_record, py::arg("max_entries"));
  m.def("cuda_trace_json", [](int d) { return on_device(d, [](auto& a) { return a.trace_json(); }); });
  m.def("cuda_clear_trace", [](int d) { on_device(d, [](auto& a) { a.clear_trace(); return 0; }); });
}

void bind_cuda_registry(py::module_& m) {
  m.def("torch_oom_available", &amem::torch_oom_available);
  m.def("profiler_hooks_available", &amem::profiler_hooks_available);
  m.def("torch_oom_check", &amem::torch_oom_check, py::arg("message"));
  m.def("cuda_configure", &amem::registry_configure, py::arg("conf"), py::arg("expandable_optional") = false);
  m.def("cuda_settings", &amem::registry_settings);
  m.def("cuda_devices_in_use", &amem::registry_devices_in_use);
  m.def("registry_use_backend", &amem::registry_use_backend, py::arg("name"), py::arg("limit_bytes") = 0);
  m.def("cuda_device_count", &amem::cuda_device_count);
  m.def("cuda_stats_json", [](int d) {  // a device not used yet has all-zero stats, as in torch
    CachingAllocator* a = amem::registry_existing(d);
    return a ? a->stats_json() : amem::Stats().to_json(amem::registry_options().max_split_size);
  });
  m.def("cuda_segments_json", [](int d) { return on_device(d, [](auto& a) { return a.segments_json(); }); });
  m.def("cuda_fragmentation_json",
        [](int d) { return on_device(d, [](auto& a) { return a.fragmentation_json(); }); });
  m.def("cuda_empty_cache", [](int d) { on_device(d, [](auto& a) { a.empty_cache(); return 0; }); });
  m.def("cuda_reset_peak_stats", [](int d) { on_device(d, [](auto& a) { a.reset_peak_stats(); return 0; }); });
  m.def("cuda_reset_accumulated_stats",
        [](int d) { on_device(d, [](auto& a) { a.reset_accumulated_stats(); return 0; }); });
  // The device allocator torch calls, without the C entry point around it (tests, tools).
  m.def("cuda_malloc", [](int d, size_t size, amem::StreamId stream) {
    return amem::registry_device(d).malloc(size, stream);
  });
  m.def("cuda_free", [](int d, uintptr_t address) { amem::registry_device(d).free(address); });
  m.def("cuda_block_info", [](int d, uintptr_t address) {
    CachingAllocator* a = amem::registry_existing(d);
    return a ? block_info(*a, address) : py::make_tuple(0, 0, 0, 0, 0);
  });
  m.def("cuda_check_valid", [](int d) { on_device(d, [](auto& a) { a.check_valid(); return 0; }); });
}

// The opcode scan amem_alloc.snapshot.load runs before unpickling an untrusted file (pickle_scan.h).
py::dict scan_pickle(const py::buffer& data, uint64_t max_marks, uint64_t max_stack, uint64_t max_batch) {
  py::buffer_info info = data.request();
  amem::PickleScan scan;
  {
    py::gil_scoped_release release;
    scan = amem::scan_pickle(static_cast<const uint8_t*>(info.ptr), static_cast<size_t>(info.size * info.itemsize),
                             amem::PickleLimits{max_marks, max_stack, max_batch});
  }
  py::dict out;
  out["refused"] = scan.refused;
  out["parsed"] = scan.parsed;
  out["problem"] = scan.problem;
  out["offset"] = scan.offset;
  out["opcodes"] = scan.opcodes;
  out["memo_puts"] = scan.memo_puts;
  out["memo_gets"] = scan.memo_gets;
  out["max_stack"] = scan.max_stack;
  out["max_marks"] = scan.max_marks;
  return out;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "amem_alloc core: the caching allocator's C++ policy, its backends and the CUDA entry points";
  bind_errors(m);
  bind_allocator(m);
  bind_policy(m);
  bind_cuda_registry(m);
  bind_recording(m);
  m.def("scan_pickle", &scan_pickle, py::arg("data"), py::arg("max_marks"), py::arg("max_stack"),
        py::arg("max_batch"));
}
