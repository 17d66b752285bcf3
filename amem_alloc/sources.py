"""Where allocator events and state come from: amem's CUDA allocators, or one Allocator.

Design note
-----------
Recording and snapshots work the same on two kinds of source, and this module is the one place
that tells them apart:

* CUDA — amem's CUDA allocators, one per device, present and future (the registry the C
  entry points serve torch from). The process has exactly one: `CUDA`.
* AllocatorDevice — one amem_alloc.Allocator (host or sim backend), shown as device 0; what
  tests and replays on a CPU record.

Both offer the same handle: `backend`, `key` (who asks for stacks), `settings()`, `devices()`
(device, trace, segments, stats per device, parsed from the core's JSON), `start_trace`,
`stop_trace`, `recording` and `set_oom_callback`. `device_source(x)` turns what a public
function was given (None for CUDA, an Allocator, or a handle) into a handle.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Union

from . import _C

DeviceState = tuple  # (device, trace dict, segment list, stats dict)


class CudaDevices:
    """amem's CUDA allocators, every device in use."""

    backend = "cuda"
    key = "cuda"
    owner = None  # lives as long as the process

    def __init__(self) -> None:
        self._recording = False

    def settings(self) -> str:
        return _C.cuda_settings()

    def devices(self) -> list[DeviceState]:
        out = []
        for d in _C.cuda_devices_in_use():
            trace = _C.cuda_trace_json(d)
            out.append((d, json.loads(trace) if trace else {"events": []},
                        json.loads(_C.cuda_segments_json(d) or "[]"), json.loads(_C.cuda_stats_json(d) or "{}")))
        return out

    def progress(self) -> tuple:
        """Changes whenever an allocator does (its counters): cheap, for periodic flushes."""
        return tuple((d, _C.cuda_stats_json(d)) for d in _C.cuda_devices_in_use())

    def start_trace(self, max_entries: int) -> None:
        _C.cuda_record(max_entries)
        self._recording = True

    def stop_trace(self) -> None:
        _C.cuda_record(0)
        self._recording = False

    @property
    def recording(self) -> bool:
        return self._recording

    def set_oom_callback(self, callback: Callable[[int], None] | None) -> None:
        _C.set_oom_callback(callback)

    def __repr__(self) -> str:
        return "<amem CUDA allocators>"


class AllocatorDevice:
    """One amem_alloc.Allocator (host/sim backend), as device 0."""

    def __init__(self, allocator: Any) -> None:
        self.owner = allocator
        self._core = allocator._core
        self.backend = allocator.backend
        self.key = id(self._core)

    def settings(self) -> str:
        return self._core.settings

    def devices(self) -> list[DeviceState]:
        core = self._core
        return [(0, json.loads(core.trace_json()), json.loads(core.segments_json()), json.loads(core.stats_json()))]

    def progress(self) -> tuple:
        return (self._core.stats_json(),)

    def start_trace(self, max_entries: int) -> None:
        self._core.start_trace(max_entries)

    def stop_trace(self) -> None:
        self._core.stop_trace()

    @property
    def recording(self) -> bool:
        return bool(self._core.tracing)

    def set_oom_callback(self, callback: Callable[[int], None] | None) -> None:
        """An Allocator's OOMs raise straight away; only the CUDA entry point calls the callback."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AllocatorDevice) and other._core is self._core

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return f"<amem source: {self.owner!r}>"


Source = Union[CudaDevices, AllocatorDevice]
CUDA = CudaDevices()


def device_source(allocator: Any = None) -> Source:
    """The handle for what a public function was given: None -> CUDA, an Allocator -> its handle."""
    if allocator is None:
        return CUDA
    if isinstance(allocator, (CudaDevices, AllocatorDevice)):
        return allocator
    if not hasattr(allocator, "_core"):
        raise TypeError(f"amem: expected an amem_alloc.Allocator, got {type(allocator).__name__}")
    return AllocatorDevice(allocator)
