"""torch.cuda under prediction: the calls scripts make, answered from the predicted run.

Design note
-----------
Two pieces. `LiveAllocator` is an allocation listener (the engine's AllocationListener): every
recorded allocation and free goes, as it happens, into amem's C++ core on the sim backend under
one policy (torch's by default), and into a list of ops (the prediction's program). Asking
`memory_allocated()` mid-script therefore reads what the caching allocator would hold at that
point on the GPU, not an estimate made afterwards.

`CudaShims` is a context manager that replaces torch.cuda's functions (and torch.cuda.memory's,
where scripts reach them by that path) with answers from a chosen card (gpus.Gpu) and from the
LiveAllocator, and puts every original back on exit, whether the body raised or not:

* device: is_available -> True, device_count, current_device / set_device / device(...),
  get_device_properties / get_device_name / get_device_capability (of the chosen card),
  mem_get_info (total less the context less what is reserved), is_bf16_supported,
  is_initialized / init;
* execution: synchronize, Stream / Event (torch.cuda's, and torch's generic ones made for CUDA) /
  stream(...) / current_stream / default_stream /
  set_stream are no-ops that keep stream identity (a Stream has a stable id, `with stream(s)`
  makes it current); Event.elapsed_time is 1.0 ms, a noted stand-in (nothing runs);
* memory: memory_allocated, max_memory_allocated, memory_reserved, max_memory_reserved,
  reset_peak_memory_stats, reset_max_memory_allocated, memory_stats (torch's keys),
  memory_summary, empty_cache (the core's empty_cache, and a release op in the program);
* traces: _record_memory_history starts or stops a record window, _snapshot returns and
  _dump_snapshot writes the predicted trace (torch's snapshot format, user frames from the
  engine's AllocInfo) — replayed from the program so far on a fresh core with its ring on;
* CUDA graphs: a capture's allocations go to its private pool, replays allocate nothing
  (graphs.py); make_graphed_callables is not modelled;
* manual_seed / seed / get_rng_state / set_rng_state and default_generators, torch.Generator made
  for CUDA: fake generators that keep the seed and offset set (generators.py);
  set_per_process_memory_fraction is checked as torch checks it, then only noted;
* the `nvidia-smi` program, where the machine has none: a stand-in for the chosen cards
  (nvidia_smi.py).

A `device` argument is accepted everywhere torch takes one; an index outside device_count raises
like torch does. The core is unlimited, so a script never sees an out-of-memory error while it
runs: whether the run fits is answered afterwards, per policy (analysis/prediction.py).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ...introspection import format_bytes
from ...patching import PatchSet, declare_many
from ...user_script import for_the_script
from .. import notes, state
from ..engine import stream_uses
from ..gpus import Gpu
from .devices import (FakeDeviceProperties, FakeEvent, FakeStream, FakeStreamContext, _device_index,
                      current_device, current_stream, default_stream, generic, set_current_device, set_stream)
from . import nvidia_smi
from .graphs import CapturePools, graph_class, graph_context
from .live import LiveAllocator
from ...replay.traced import describe_infos, traced_snapshot
from ..run import NOTE, RunRecorder


# ============================================================================ the patch set
CUDA_NAMES = ("is_available", "is_initialized", "init", "_lazy_init", "device_count", "current_device", "set_device",
              "device", "device_of", "_exchange_device", "_maybe_exchange_device", "get_device_properties",
              "get_device_name", "get_device_capability", "is_bf16_supported",
              "mem_get_info", "caching_allocator_alloc", "caching_allocator_delete", "synchronize", "Stream", "Event", "stream", "StreamContext", "current_stream",
              "default_stream", "set_stream", "memory_allocated", "max_memory_allocated", "memory_reserved",
              "max_memory_reserved", "memory_cached", "reset_peak_memory_stats", "reset_max_memory_allocated",
              "reset_max_memory_cached", "memory_stats", "memory_summary", "empty_cache", "_record_memory_history",
              "_snapshot", "_dump_snapshot", "is_current_stream_capturing", "set_per_process_memory_fraction",
              "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed", "get_rng_state",
              "get_rng_state_all", "set_rng_state", "set_rng_state_all", "graph", "CUDAGraph",
              "make_graphed_callables", "graph_pool_handle", "default_generators")
ACCELERATOR_NAMES = ("current_stream", "set_stream", "synchronize", "device_count", "current_device_index",
                     "current_device_idx", "set_device_index", "set_device_idx", "device_index", "empty_cache",
                     "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
                     'memory_stats', 'reset_peak_memory_stats', 'get_memory_info')
_WHY = "torch.cuda answers from the chosen card and the predicted run (shims/cuda.py)"
CUDA = declare_many("torch.cuda", CUDA_NAMES, _WHY)
CUDA_MEMORY = declare_many("torch.cuda.memory", CUDA_NAMES, _WHY + "; where scripts reach them by that path")
CUDA_RANDOM = declare_many("torch.cuda.random", CUDA_NAMES, _WHY + "; where scripts reach them by that path "
                           "(Megatron's RNG tracker)")
GENERIC = declare_many("torch", ["Stream", "Event"], "a stream or event made for CUDA (or the accelerator's, by "
                       "default) is the fake one: torch's would ask the driver (DataParallel's scatter makes one)")
GENERATOR = declare_many("torch", ["Generator"], "a generator made for CUDA is the fake one (generators.py): "
                         "torch's would ask the driver")
ACCELERATOR = declare_many("torch.accelerator", ACCELERATOR_NAMES,
                           "torch.accelerator asks the C++ runtime for devices and streams: answered by the shims too")


class CudaShims:
    """Context manager: torch.cuda answers from `gpu` and `live` until exit (then all is restored)."""

    def __init__(self, gpu: Gpu, live: LiveAllocator, session: Any, recording: RunRecorder, device_count: int = 1,
                 on_dump: Callable[[Path], None] | None = None) -> None:
        self.gpu, self.live, self.device_count = gpu, live, device_count
        self.session, self.recording = session, recording   # the engine, and the run it records (run.py)
        self.on_dump = on_dump
        self.record_windows: list[list[int | None]] = []   # [start op, end op or None] (_record_memory_history)
        self.pools = CapturePools(session)   # CUDA graphs' private pools (graphs.py)
        from .generators import CudaGenerators

        self.rng = CudaGenerators(device_count)   # the devices' generators (generators.py)
        self.raw_blocks: dict[int, Any] = {}   # address -> the fake bytes caching_allocator_alloc gave
        self.patches = PatchSet()

    # ---------------------------------------------------------------- device
    def _check(self, device: Any) -> int:
        index = _device_index(device)
        if not 0 <= index < self.device_count:
            raise for_the_script(AssertionError(f"Invalid device id {index} (predicting {self.device_count} "
                                                f"device{'s' if self.device_count != 1 else ''})"))
        return index

    def get_device_properties(self, device: Any = None) -> FakeDeviceProperties:
        self._check(device)
        return FakeDeviceProperties(self.gpu)

    def get_device_name(self, device: Any = None) -> str:
        self._check(device)
        return self.gpu.name

    def get_device_capability(self, device: Any = None) -> tuple[int, int]:
        self._check(device)
        return self.gpu.capability

    def set_device(self, device: Any) -> None:
        set_current_device(self._check(device))

    def synchronize(self, device: Any = None) -> None:
        self._check(device)
        stream_uses.synchronised(None)

    def set_per_process_memory_fraction(self, fraction: float, device: Any = None) -> None:
        """Checked like torch's, then only noted: `fits` is judged against the card's usable memory."""
        self._check(device)
        if not isinstance(fraction, float) or not 0 <= fraction <= 1:
            raise for_the_script(ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1"))
        self.memory_fraction = fraction

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        self._check(device)
        reserved = self.live.stats().get("reserved_bytes.all.current", 0)
        return max(0, self.gpu.usable - reserved), self.gpu.total_memory

    def caching_allocator_alloc(self, size: int, device: Any = None, stream: Any = None) -> int:
        """Raw bytes from the caching allocator (CuPy's bridge, extensions): a fake block of `size`
        bytes, recorded as any allocation, its address handed back; held until deleted."""
        import torch

        index = self._check(device)
        block = torch.empty(int(size), dtype=torch.uint8, device=torch.device("cuda", index))
        self.raw_blocks[block.data_ptr()] = block
        return block.data_ptr()

    def caching_allocator_delete(self, mem_ptr: int) -> None:
        if self.raw_blocks.pop(int(mem_ptr), None) is None:
            raise for_the_script(RuntimeError(f"invalid device pointer: {mem_ptr:#x} (not from caching_allocator_alloc)"))

    def _device_class(self) -> type:
        shims = self

        class device:  # noqa: N801 - torch.cuda.device's name
            def __init__(self, device: Any) -> None:
                self.idx, self.prev_idx = _device_index(device), -1

            def __enter__(self) -> None:
                self.prev_idx = shims.exchange_device(self.idx)

            def __exit__(self, *exc: Any) -> None:
                set_current_device(self.prev_idx)

        return device

    def _device_of_class(self, device: type) -> type:
        class device_of(device):  # noqa: N801 - torch.cuda.device_of's name (rnn.py's flatten_parameters)
            def __init__(self, obj: Any) -> None:
                super().__init__(obj.get_device() if obj.is_cuda else -1)

        return device_of

    def exchange_device(self, device: int) -> int:
        """torch.cuda._exchange_device: the current device, after making `device` current (< 0: none)."""
        before = current_device()
        if device >= 0:
            self.set_device(device)
        return before

    # ---------------------------------------------------------------- memory
    def _stat(self, key: str, device: Any = None) -> int:
        self._check(device)
        return int(self.live.stats().get(key, 0))

    def memory_stats(self, device: Any = None) -> dict[str, int]:
        self._check(device)
        return self.live.stats()

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        self._check(device)
        self.live.reset_peaks()

    def empty_cache(self) -> None:
        self.session.release()   # the listeners hear it: the run gets a release op, the live core empties

    def memory_summary(self, device: Any = None, abbreviated: bool = False) -> str:
        s = self.memory_stats(device)
        return (f"amem predict (no GPU): allocated {format_bytes(s.get('allocated_bytes.all.current', 0))} "
                f"(peak {format_bytes(s.get('allocated_bytes.all.peak', 0))}), reserved "
                f"{format_bytes(s.get('reserved_bytes.all.current', 0))} "
                f"(peak {format_bytes(s.get('reserved_bytes.all.peak', 0))}) on {self.gpu.name}")

    # ---------------------------------------------------------------- traces
    def record_memory_history(self, enabled: Any = "all", *args: Any, **kwargs: Any) -> None:
        now = len(self.recording.ops)
        open_window = bool(self.record_windows) and self.record_windows[-1][1] is None
        if enabled in (None, False):
            if open_window:
                self.record_windows[-1][1] = now
        elif not open_window:
            self.record_windows.append([now, None])

    def _record_start(self) -> int:
        """Where the trace of a dump made now begins: the open window's start, else the whole run."""
        if self.record_windows and self.record_windows[-1][1] is None:
            return self.record_windows[-1][0]
        return 0

    def snapshot(self, *args: Any, **kwargs: Any) -> dict:
        run = self.recording.finish("", live_conf=self.live.conf)   # the run so far
        snap = traced_snapshot(run.ops, describe_infos(run.infos), run.live_conf, start=self._record_start())
        snap["allocator_settings"]["prediction"] = NOTE
        return snap

    def dump_snapshot(self, filename: Any = "dump_snapshot.pickle") -> None:
        from ...snapshot import save_snapshot

        path = save_snapshot(self.snapshot(), filename)
        if self.on_dump is not None:
            self.on_dump(path)

    # ---------------------------------------------------------------- the table
    def _table(self) -> dict[str, Any]:
        noop = _noop  # each use a function object of its own (tools that index torch's functions
        device = self._device_class()   # by identity, like torch._dynamo, refuse one object under two
        return {                        # names: hence two lambdas for the two exchange functions)
            "is_available": lambda: True,
            "is_initialized": lambda: True,
            "init": noop(),
            "_lazy_init": noop(),
            "device_count": lambda: self.device_count,
            "current_device": current_device,
            "set_device": self.set_device,
            "device": device, "device_of": self._device_of_class(device),
            "_exchange_device": lambda d: self.exchange_device(d),
            "_maybe_exchange_device": lambda d: self.exchange_device(d),
            "get_device_properties": self.get_device_properties,
            "get_device_name": self.get_device_name,
            "get_device_capability": self.get_device_capability,
            "is_bf16_supported": lambda *a, **k: self.gpu.capability >= (8, 0),
            "mem_get_info": self.mem_get_info,
            "caching_allocator_alloc": self.caching_allocator_alloc,
            "caching_allocator_delete": self.caching_allocator_delete,
            "synchronize": self.synchronize,
            "Stream": FakeStream,
            "Event": FakeEvent,
            "stream": FakeStreamContext,
            "StreamContext": FakeStreamContext,
            "current_stream": current_stream,
            "default_stream": default_stream,
            "set_stream": set_stream,
            "memory_allocated": lambda device=None: self._stat("allocated_bytes.all.current", device),
            "max_memory_allocated": lambda device=None: self._stat("allocated_bytes.all.peak", device),
            "memory_reserved": lambda device=None: self._stat("reserved_bytes.all.current", device),
            "max_memory_reserved": lambda device=None: self._stat("reserved_bytes.all.peak", device),
            "memory_cached": lambda device=None: self._stat("reserved_bytes.all.current", device),
            "reset_peak_memory_stats": self.reset_peak_memory_stats,
            "reset_max_memory_allocated": self.reset_peak_memory_stats,
            "reset_max_memory_cached": self.reset_peak_memory_stats,
            "memory_stats": self.memory_stats,
            "memory_summary": self.memory_summary,
            "empty_cache": self.empty_cache,
            "_record_memory_history": self.record_memory_history,
            "_snapshot": self.snapshot,
            "_dump_snapshot": self.dump_snapshot,
            "is_current_stream_capturing": self.pools.is_capturing,
            "set_per_process_memory_fraction": self.set_per_process_memory_fraction,
            **self.rng.table(),   # seeding, RNG states, default_generators
            "graph": graph_context(self.pools),
            "CUDAGraph": graph_class(self.pools),
            "make_graphed_callables": _not_modelled("torch.cuda.make_graphed_callables (CUDA graphs)"),
            "graph_pool_handle": self.pools.handle,
        }

    def _accelerator_table(self) -> dict[str, Any]:
        """torch.accelerator delegates is_available to torch.cuda (so it says yes), then asks the C++
        runtime for streams and devices: those answer from the prediction too."""
        t = self._table()
        return {"current_stream": current_stream, "set_stream": set_stream, "synchronize": t["synchronize"],
                "device_count": t["device_count"], "current_device_index": t["current_device"],
                "current_device_idx": t["current_device"], "set_device_index": self.set_device,
                "set_device_idx": self.set_device, "device_index": t["device"], "empty_cache": t["empty_cache"],
                "memory_allocated": t["memory_allocated"], "max_memory_allocated": t["max_memory_allocated"],
                "memory_reserved": t["memory_reserved"], "max_memory_reserved": t["max_memory_reserved"],
                "memory_stats": t["memory_stats"], "reset_peak_memory_stats": t["reset_peak_memory_stats"],
                "get_memory_info": t["mem_get_info"]}

    def __enter__(self) -> "CudaShims":
        import torch._dynamo  # noqa: F401 - builds its table of torch functions from the real ones now;
        import torch.accelerator  # imported later (torch does, lazily) it would meet the stand-ins
        import torch.cuda
        import torch.cuda.memory
        import torch.cuda.random

        table = self._table()
        if state.current() is None:   # an engine without a state of its own (a test double): one here
            own = state.SessionState()
            self.patches.callback(state.leave, own, state.enter(own))
        try:
            self.patches.apply_all(CUDA, torch.cuda, table)
            self.patches.apply_all(CUDA_MEMORY, torch.cuda.memory, table, existing_only=True)
            self.patches.apply_all(CUDA_RANDOM, torch.cuda.random, table, existing_only=True)
            self.patches.apply_all(ACCELERATOR, torch.accelerator, self._accelerator_table(), existing_only=True)
            self.patches.apply_all(GENERIC, torch, {"Stream": generic("Stream", torch.Stream, FakeStream),
                                                    "Event": generic("Event", torch.Event, FakeEvent)})
            from .generators import generator_class

            self.patches.apply_all(GENERATOR, torch, {"Generator": generator_class()})
            nvidia_smi.install(self.patches, self.gpu, self.device_count)
        except BaseException:
            self.patches.close()
            raise
        set_current_device(0)
        set_stream(None)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.pools.closed = True
        set_stream(None)
        set_current_device(0)
        self.patches.close()


# ============================================================================ CUDA graphs
def _not_modelled(what: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise notes.NotModelledError(f"{what} is not modelled by prediction; predict the code without the "
                                     "graph (its eager allocations), or measure it on a GPU with amem run")
    return refuse


def _not_modelled_class(what: str) -> type:
    class NotModelled:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            _not_modelled(what)()
    NotModelled.__name__ = what.split()[0].rsplit(".", 1)[-1]
    return NotModelled


def _noop() -> Callable[..., None]:
    def noop(*args: Any, **kwargs: Any) -> None:
        return None

    return noop
