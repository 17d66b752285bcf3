"""Make torch's own memory APIs report amem's figures while amem is the CUDA allocator.

Under a pluggable allocator torch's memory introspection raises or returns nothing. enable()
(unless called with patch_torch=False) replaces these functions, in both torch.cuda.memory and
the torch.cuda namespace:

    memory_stats_as_nested_dict   -> amem's counters, torch's nested format. Through it, the
                                     unpatched memory_stats, memory_allocated, memory_reserved,
                                     max_memory_allocated, max_memory_reserved, memory_summary
                                     (and torch.cuda.memory_stats) report amem's figures.
    reset_peak_memory_stats       -> amem's peaks (also reset_max_memory_allocated/cached)
    reset_accumulated_memory_stats-> amem's accumulated counters
    memory_snapshot               -> amem's segments, torch's format
    _snapshot                     -> amem's snapshot (segments, device_traces, settings); so
                                     _dump_snapshot writes amem's snapshot
    _record_memory_history        -> amem_alloc.record(...)

torch.cuda.empty_cache(), tensor.record_stream() and set_per_process_memory_fraction() need no
patch: they reach amem through the pluggable allocator's hooks. unpatch() restores everything.
"""
from __future__ import annotations

from typing import Any, Callable

from . import devices
from .patching import PatchSet, declare_many
from .recording import record
from .snapshot_dump import build_snapshot

PATCHED_NAMES = (
    "memory_stats_as_nested_dict",
    "reset_peak_memory_stats",
    "reset_accumulated_memory_stats",
    "memory_snapshot",
    "_snapshot",
    "_record_memory_history",
)

_WHY = "torch's memory functions report amem's figures while amem is the CUDA allocator (torch_patch.py)"
MEMORY = declare_many("torch.cuda.memory", PATCHED_NAMES, _WHY)
CUDA = declare_many("torch.cuda", PATCHED_NAMES, _WHY)
_patches: list[PatchSet] = []   # the one active set (enable() patches once per process)


def nest_stats(flat: dict[str, int]) -> dict[str, Any]:
    """{"allocated_bytes.all.current": 1} -> {"allocated_bytes": {"all": {"current": 1}}}."""
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        node = nested
        *path, leaf = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


# ---------------------------------------------------------------- replacements


def memory_stats_as_nested_dict(device: Any = None) -> dict[str, Any]:
    return nest_stats(devices.memory_stats(device))


def reset_peak_memory_stats(device: Any = None) -> None:
    devices.reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device: Any = None) -> None:
    devices.reset_accumulated_memory_stats(device)


def _snapshot(device: Any = None, augment_with_fx_traces: bool = False) -> dict:
    return build_snapshot()


def memory_snapshot(mempool_id: Any = None, include_traces: bool = True) -> list:
    return _snapshot()["segments"]


def _record_memory_history(enabled: Any = "all", context: Any = "all", stacks: str = "all",
                           max_entries: int = 1_000_000, *args: Any, **kwargs: Any) -> None:
    on = enabled not in (None, False)
    record(enabled=on, max_entries=max_entries, stacks="python" if on and stacks in ("all", "python") else None)


REPLACEMENTS: dict[str, Callable[..., Any]] = {
    "memory_stats_as_nested_dict": memory_stats_as_nested_dict,
    "reset_peak_memory_stats": reset_peak_memory_stats,
    "reset_accumulated_memory_stats": reset_accumulated_memory_stats,
    "memory_snapshot": memory_snapshot,
    "_snapshot": _snapshot,
    "_record_memory_history": _record_memory_history,
}


# ---------------------------------------------------------------- patching


def patch() -> None:
    """Installs the replacements (idempotent)."""
    import torch.cuda
    import torch.cuda.memory

    if _patches:
        return
    patches = PatchSet()
    patches.apply_all(MEMORY, torch.cuda.memory, {n: REPLACEMENTS[n] for n in PATCHED_NAMES}, existing_only=True)
    patches.apply_all(CUDA, torch.cuda, {n: REPLACEMENTS[n] for n in PATCHED_NAMES}, existing_only=True)
    _patches.append(patches)


def unpatch() -> None:
    """Restores torch's own functions."""
    while _patches:
        _patches.pop().close()
