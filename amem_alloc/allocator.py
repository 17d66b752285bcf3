"""amem_alloc.Allocator: the caching allocator on a CPU, through the host or sim backend.

It runs the same C++ policy core as the CUDA path (amem_alloc.enable()); only the backend that
supplies segments differs. Tests drive it, and replay builds on it.

    a = Allocator(backend="sim", limit_bytes=8 << 30)
    p = a.malloc(1000)          # an address; 512-byte rounding, pools, best fit, split/merge
    a.free(p)
    a.memory_stats()["reserved_bytes.all.current"]
"""
from __future__ import annotations

from typing import Any

from . import _C
from .config import resolve_with_policy
from .introspection import Fragmentation, SegmentInfo, parse_fragmentation, parse_segments, parse_stats

BACKENDS = ("host", "sim")


def _check_int(name: str, value: Any, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"amem: {name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"amem: {name} must be >= {minimum}, got {value}")
    if value >= 1 << 64:
        raise ValueError(f"amem: {name} {value} does not fit in 64 bits")
    return value


class Allocator:
    """A caching allocator over the `host` (real host memory) or `sim` (addresses only) backend.

    limit_bytes caps the backend's capacity (0: unlimited for sim; for host, what mmap gives),
    so the out-of-memory path can be exercised. It starts from the core's defaults (torch's
    policy), whatever the environment says, or from `policy`, a name of amem_alloc/policies.py
    (e.g. "amem", what enable() uses); keyword options are those of AMEM_CONF and override it.
    """

    def __init__(self, backend: str = "sim", limit_bytes: int = 0, policy: str | None = None, **options: Any):
        if backend not in BACKENDS:
            raise ValueError(
                f"amem: unknown backend {backend!r}; Allocator takes one of {BACKENDS} "
                "(the cuda backend is used through amem_alloc.enable())"
            )
        _check_int("limit_bytes", limit_bytes)
        conf = resolve_with_policy(options, "amem-defaults" if policy is None else policy, env={}).conf
        self._core = _C.CoreAllocator(backend, conf, limit_bytes)

    # ---------------------------------------------------------------- requests
    def malloc(self, size: int, stream: int = 0) -> int:
        """The address of a block of at least `size` bytes for `stream`; 0 for size 0."""
        return self._core.malloc(_check_int("size", size), _check_int("stream", stream))

    def free(self, address: int) -> None:
        """Returns a block; InvalidFreeError (a ValueError) if it is not ours or already free."""
        self._core.free(_check_int("address", address))

    def record_stream(self, address: int, stream: int) -> None:
        """Marks a block as used on `stream`: when freed it waits for that stream's work."""
        self._core.record_stream(_check_int("address", address), _check_int("stream", stream))

    def set_stream_busy(self, stream: int, busy: bool = True) -> None:
        """Simulates unfinished work on `stream` (events recorded on it stay pending until idle)."""
        self._core.set_stream_busy(_check_int("stream", stream), bool(busy))

    def empty_cache(self) -> None:
        """Returns every cached whole segment to the backend."""
        self._core.empty_cache()

    def set_memory_fraction(self, fraction: float) -> None:
        """Caps reserved memory at fraction x the backend's capacity (torch semantics)."""
        self._core.set_memory_fraction(float(fraction))

    # ---------------------------------------------------------------- introspection
    def memory_stats(self) -> dict[str, int]:
        """torch.cuda.memory_stats()-style flat dict (allocated_bytes.all.current, ...)."""
        return parse_stats(self._core.stats_json())

    def segments(self) -> list[SegmentInfo]:
        return parse_segments(self._core.segments_json())

    def fragmentation(self) -> Fragmentation:
        return parse_fragmentation(self._core.fragmentation_json())

    def reset_peak_memory_stats(self) -> None:
        self._core.reset_peak_stats()

    def reset_accumulated_memory_stats(self) -> None:
        self._core.reset_accumulated_stats()

    def check_valid(self) -> None:
        """Walks every segment and block; raises RuntimeError naming the first broken invariant."""
        self._core.check_valid()

    def is_valid(self) -> bool:
        try:
            self._core.check_valid()
        except RuntimeError:
            return False
        return True

    def block_info(self, address: int) -> dict[str, int] | None:
        """The allocated block containing `address` (None if none)."""
        start, size, requested, stream, seq = self._core.block_info(_check_int("address", address))
        if size == 0:
            return None
        return {"address": start, "size": size, "requested_size": requested, "stream": stream, "alloc_seq": seq}

    # ---------------------------------------------------------------- traces (amem_alloc.recording, .snapshot_dump)
    def record(self, enabled: bool = True, max_entries: int | None = None, stacks: str | None = None) -> None:
        """Starts (or with enabled=False stops) recording this allocator's events; see amem_alloc.record."""
        from . import recording

        entries = recording.DEFAULT_MAX_ENTRIES if max_entries is None else max_entries
        recording.record(enabled, max_entries=entries, stacks=stacks, allocator=self)

    def snapshot(self) -> dict:
        """This allocator's segments and recorded trace in torch.cuda.memory._snapshot()'s format."""
        from .snapshot_dump import build_snapshot

        return build_snapshot(self)

    def dump_snapshot(self, path: Any) -> Any:
        """Writes snapshot() to `path` (a pickle torch's _memory_viz reads); returns the Path."""
        from .snapshot_dump import dump_snapshot

        return dump_snapshot(path, allocator=self)

    @property
    def backend(self) -> str:
        return self._core.backend

    @property
    def settings(self) -> str:
        return self._core.settings

    def __repr__(self) -> str:
        return f"Allocator(backend={self.backend!r}, {self.settings})"
