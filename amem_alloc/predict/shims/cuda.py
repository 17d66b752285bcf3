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
* execution: synchronize, Stream / Event / stream(...) / current_stream / default_stream /
  set_stream are no-ops that keep stream identity (a Stream has a stable id, `with stream(s)`
  makes it current); Event.elapsed_time is 0.0 (nothing runs);
* memory: memory_allocated, max_memory_allocated, memory_reserved, max_memory_reserved,
  reset_peak_memory_stats, reset_max_memory_allocated, memory_stats (torch's keys),
  memory_summary, empty_cache (the core's empty_cache, and a release op in the program);
* traces: _record_memory_history starts or stops a record window, _snapshot returns and
  _dump_snapshot writes the predicted trace (torch's snapshot format, user frames from the
  engine's AllocInfo) — replayed from the program so far on a fresh core with its ring on;
* manual_seed / manual_seed_all / seed / seed_all: no-ops (fake tensors hold no values);
  set_per_process_memory_fraction is checked as torch checks it, then only noted.

A `device` argument is accepted everywhere torch takes one; an index outside device_count raises
like torch does. The core is unlimited, so a script never sees an out-of-memory error while it
runs: whether the run fits is answered afterwards, per policy (outcome.py).
"""
from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any, Callable

from ... import replay
from ..._C import CoreAllocator
from ...introspection import format_bytes, parse_stats
from .. import notes
from ..engine import stream_uses
from ..gpus import Gpu

TRACE_ACTIONS_PER_OP = 4  # a ring big enough for a re-simulation: alloc/free plus segment events


class LiveAllocator:
    """Listener: feeds the recorded allocations into the core (sim backend) as they happen."""

    def __init__(self, conf: str = "") -> None:
        self.conf = conf
        self.core = CoreAllocator("sim", conf, 0)
        self.ops: list[tuple[int, int, int, int]] = []   # (kind, key, size, stream) as replay.pack takes
        self.infos: dict[int, Any] = {}                   # key -> AllocInfo
        self.markers: list[tuple[int, str]] = []          # (ops before it, name)
        self.live: dict[int, int] = {}                    # key -> address in the core
        self.unknown_frees = 0
        self.record_windows: list[list[int | None]] = []  # [start op, end op or None]

    # ---------------------------------------------------------------- the listener protocol
    def on_alloc(self, key: int, stream: int, info: Any) -> None:
        size = int(info.requested)
        self.ops.append((replay.ALLOC, key, size, stream))
        self.infos[key] = info
        if key in self.live:                      # a key reused without its free: release the old block
            self.core.free(self.live.pop(key))
        address = self.core.malloc(size, stream)
        if address:
            self.live[key] = address

    def on_free(self, key: int) -> None:
        self.ops.append((replay.FREE, key, 0, 0))
        address = self.live.pop(key, None)
        if address is None:
            self.unknown_frees += 1
        else:
            self.core.free(address)

    def on_marker(self, name: str) -> None:
        self.markers.append((len(self.ops), name))

    # ---------------------------------------------------------------- what scripts ask
    def release(self) -> None:
        """torch.cuda.empty_cache(): the core empties its cache; the program gets a release op."""
        self.ops.append((replay.RELEASE, 0, 0, 0))
        self.core.empty_cache()

    def stats(self) -> dict[str, int]:
        return parse_stats(self.core.stats_json())

    def reset_peaks(self) -> None:
        self.core.reset_peak_stats()

    def program(self) -> replay.Program:
        return replay.Program(replay.pack(self.ops))

    def start_record(self) -> None:
        if not self.record_windows or self.record_windows[-1][1] is not None:
            self.record_windows.append([len(self.ops), None])

    def stop_record(self) -> None:
        if self.record_windows and self.record_windows[-1][1] is None:
            self.record_windows[-1][1] = len(self.ops)

    def record_start(self) -> int:
        """Where the trace of a dump made now begins: the open window's start, else the whole run."""
        if self.record_windows and self.record_windows[-1][1] is None:
            return self.record_windows[-1][0]
        return 0


# ============================================================================ fake device objects
class FakeDeviceProperties:
    """What torch.cuda.get_device_properties returns, for the chosen card."""

    def __init__(self, gpu: Gpu) -> None:
        self.name = gpu.name
        self.major, self.minor = gpu.capability
        self.total_memory = gpu.total_memory
        self.multi_processor_count = gpu.multi_processor_count
        self.is_integrated = False
        self.is_multi_gpu_board = False
        self.L2_cache_size = 50 << 20
        self.warp_size = 32
        self.gcnArchName = "NVIDIA CUDA"
        self.uuid = "00000000-0000-0000-0000-amem-predict"

    def __repr__(self) -> str:
        return (f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory >> 20}MB, multi_processor_count={self.multi_processor_count}) "
                "[predicted: no GPU]")


def _device_index(device: Any) -> int:
    if device is None:
        return _DEVICE.index
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        _, _, idx = device.partition(":")
        return int(idx) if idx else _DEVICE.index
    index = getattr(device, "index", None)
    return _DEVICE.index if index is None else int(index)


class _Device(threading.local):
    def __init__(self) -> None:
        self.index = 0


_DEVICE = _Device()


class _StreamState(threading.local):
    def __init__(self) -> None:
        self.current: "FakeStream | None" = None


_STREAMS = _StreamState()
_next_stream_id = [0]
_stream_lock = threading.Lock()


class FakeStream:
    """torch.cuda.Stream stand-in: a stable id, nothing runs. Equal streams share the id."""

    def __init__(self, device: Any = None, priority: int = 0, *, stream_id: int | None = None, **_: Any) -> None:
        if stream_id is None:
            with _stream_lock:
                _next_stream_id[0] += 1
                stream_id = _next_stream_id[0]
        self.stream_id = stream_id
        self.cuda_stream = stream_id      # torch's raw handle; the default stream is 0
        self.device_index = _device_index(device)
        self.priority = priority

    @property
    def device(self) -> Any:
        import torch

        return torch.device("cuda", self.device_index)

    def wait_stream(self, stream: Any) -> None:
        stream_uses.synchronised(getattr(stream, "stream_id", None))

    def wait_event(self, event: Any) -> None:
        event.wait(self)

    def synchronize(self) -> None:
        stream_uses.synchronised(self.stream_id)

    def query(self) -> bool:
        return True

    def is_capturing(self) -> bool:
        return False

    def record_event(self, event: Any = None) -> "FakeEvent":
        event = event or FakeEvent()
        event.record(self)
        return event

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, FakeStream) and other.stream_id == self.stream_id

    def __hash__(self) -> int:
        return hash(("amem-fake-stream", self.stream_id))

    def __repr__(self) -> str:
        return f"<torch.cuda.Stream device=cuda:{self.device_index} cuda_stream={self.cuda_stream:#x} [predicted]>"


DEFAULT_STREAM = FakeStream(stream_id=0)


class FakeEvent:
    """torch.cuda.Event stand-in: recording and waiting do nothing; no time passes."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.enable_timing = enable_timing
        self.stream: FakeStream | None = None
        self.position: int | None = None   # the point of the program it marks (stream_uses.position)

    def record(self, stream: Any = None) -> None:
        self.stream = stream or current_stream()
        self.position = stream_uses.position()

    def wait(self, stream: Any = None) -> None:
        if self.stream is not None:   # waiting for an event: its stream's work up to it is done
            stream_uses.synchronised(self.stream.stream_id, self.position)

    def synchronize(self) -> None:
        if self.stream is not None:   # the CPU waits for the device to reach it (see stream_uses.py)
            stream_uses.synchronised(None, self.position)

    def query(self) -> bool:
        return True

    def elapsed_time(self, end_event: Any) -> float:
        return 0.0


def current_stream(device: Any = None) -> FakeStream:
    return _STREAMS.current or DEFAULT_STREAM


def current_stream_id() -> int:
    """The id of the stream a `with torch.cuda.stream(s)` block made current (0: the default)."""
    return current_stream().stream_id


def default_stream(device: Any = None) -> FakeStream:
    return DEFAULT_STREAM


def set_stream(stream: Any) -> None:
    _STREAMS.current = stream if isinstance(stream, FakeStream) else None


class FakeStreamContext:
    """`with torch.cuda.stream(s):` makes s current for the block; None leaves the stream as it is."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.previous = stream, None

    def __enter__(self) -> Any:
        self.previous = _STREAMS.current
        if self.stream is not None:
            set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc: Any) -> None:
        _STREAMS.current = self.previous




# ============================================================================ the patch set
class CudaShims:
    """Context manager: torch.cuda answers from `gpu` and `live` until exit (then all is restored)."""

    def __init__(self, gpu: Gpu, live: LiveAllocator, device_count: int = 1,
                 on_dump: Callable[[Path], None] | None = None) -> None:
        self.gpu, self.live, self.device_count = gpu, live, device_count
        self.on_dump = on_dump
        self._saved: list[tuple[Any, str, Any, bool]] = []

    # ---------------------------------------------------------------- device
    def _check(self, device: Any) -> int:
        index = _device_index(device)
        if not 0 <= index < self.device_count:
            raise AssertionError(f"Invalid device id {index} (predicting {self.device_count} "
                                 f"device{'s' if self.device_count != 1 else ''})")
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
        _DEVICE.index = self._check(device)

    def synchronize(self, device: Any = None) -> None:
        self._check(device)
        stream_uses.synchronised(None)

    def set_per_process_memory_fraction(self, fraction: float, device: Any = None) -> None:
        """Checked like torch's, then only noted: `fits` is judged against the card's usable memory."""
        self._check(device)
        if not isinstance(fraction, float) or not 0 <= fraction <= 1:
            raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
        self.memory_fraction = fraction

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        self._check(device)
        reserved = self.live.stats().get("reserved_bytes.all.current", 0)
        return max(0, self.gpu.usable - reserved), self.gpu.total_memory

    def _device_class(self) -> type:
        shims = self

        class device:  # noqa: N801 - torch.cuda.device's name
            def __init__(self, device: Any) -> None:
                self.idx, self.prev_idx = _device_index(device), -1

            def __enter__(self) -> None:
                self.prev_idx = _DEVICE.index
                if self.idx >= 0:
                    shims.set_device(self.idx)

            def __exit__(self, *exc: Any) -> None:
                _DEVICE.index = self.prev_idx

        return device

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
        self.live.release()

    def memory_summary(self, device: Any = None, abbreviated: bool = False) -> str:
        s = self.memory_stats(device)
        return (f"amem predict (no GPU): allocated {format_bytes(s.get('allocated_bytes.all.current', 0))} "
                f"(peak {format_bytes(s.get('allocated_bytes.all.peak', 0))}), reserved "
                f"{format_bytes(s.get('reserved_bytes.all.current', 0))} "
                f"(peak {format_bytes(s.get('reserved_bytes.all.peak', 0))}) on {self.gpu.name}")

    # ---------------------------------------------------------------- traces
    def record_memory_history(self, enabled: Any = "all", *args: Any, **kwargs: Any) -> None:
        if enabled in (None, False):
            self.live.stop_record()
        else:
            self.live.start_record()

    def snapshot(self, *args: Any, **kwargs: Any) -> dict:
        from ..analysis.prediction import predicted_snapshot

        return predicted_snapshot(self.live.ops, self.live.infos, self.live.conf, start=self.live.record_start())

    def dump_snapshot(self, filename: Any = "dump_snapshot.pickle") -> None:
        from ...snapshot import save_snapshot

        path = save_snapshot(self.snapshot(), filename)
        if self.on_dump is not None:
            self.on_dump(path)

    # ---------------------------------------------------------------- the table
    def _table(self) -> dict[str, Any]:
        noop = _noop  # each use a function object of its own (tools that index torch's functions
        return {      # by identity, like torch._dynamo, refuse one object under two names)
            "is_available": lambda: True,
            "is_initialized": lambda: True,
            "init": noop(),
            "_lazy_init": noop(),
            "device_count": lambda: self.device_count,
            "current_device": lambda: _DEVICE.index,
            "set_device": self.set_device,
            "device": self._device_class(),
            "get_device_properties": self.get_device_properties,
            "get_device_name": self.get_device_name,
            "get_device_capability": self.get_device_capability,
            "is_bf16_supported": lambda *a, **k: self.gpu.capability >= (8, 0),
            "mem_get_info": self.mem_get_info,
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
            "is_current_stream_capturing": lambda: False,
            "set_per_process_memory_fraction": self.set_per_process_memory_fraction,
            "manual_seed": noop(),
            "manual_seed_all": noop(),
            "seed": noop(),
            "seed_all": noop(),
            "initial_seed": lambda: 0,
            "get_rng_state": get_rng_state,
            "get_rng_state_all": lambda: [get_rng_state(i) for i in range(self.device_count)],
            "set_rng_state": set_rng_state,
            "set_rng_state_all": lambda states: [set_rng_state(s) for s in states] and None,
            "graph": _not_modelled_class("torch.cuda.graph (CUDA graph capture)"),
            "CUDAGraph": _not_modelled_class("torch.cuda.CUDAGraph (CUDA graphs)"),
            "make_graphed_callables": _not_modelled("torch.cuda.make_graphed_callables (CUDA graphs)"),
            "graph_pool_handle": _not_modelled("torch.cuda.graph_pool_handle (CUDA graphs)"),
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

        table = self._table()
        patches = [(torch.cuda, table, False), (torch.cuda.memory, table, True),
                   (torch.accelerator, self._accelerator_table(), True)]
        try:
            for module, names, existing_only in patches:
                for name, value in names.items():
                    if existing_only and not hasattr(module, name):
                        continue
                    self._saved.append((module, name, getattr(module, name, None), hasattr(module, name)))
                    setattr(module, name, value)
        except BaseException:
            self._restore()
            raise
        _DEVICE.index = 0
        _STREAMS.current = None
        return self

    def _restore(self) -> None:
        while self._saved:
            module, name, value, existed = self._saved.pop()
            if existed:
                setattr(module, name, value)
            else:
                with contextlib.suppress(AttributeError):
                    delattr(module, name)
        _STREAMS.current = None
        _DEVICE.index = 0

    def __exit__(self, *exc: Any) -> None:
        self._restore()


# ============================================================================ RNG state, CUDA graphs
_RNG_STATE_BYTES = 16   # CUDAGeneratorImpl::get_state: seed (8 bytes) and philox offset (8 bytes)


def get_rng_state(device: Any = "cuda") -> Any:
    """A stand-in for the CUDA generator's state (no generator runs): a real CPU byte tensor."""
    import torch

    notes.record(notes.STAND_IN, "torch.cuda.get_rng_state(): a zero generator state")
    return torch.zeros(_RNG_STATE_BYTES, dtype=torch.uint8)


def set_rng_state(state: Any, device: Any = "cuda") -> None:
    notes.record(notes.STAND_IN, "torch.cuda.set_rng_state(): ignored (no generator runs)")


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
