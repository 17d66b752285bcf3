"""A program replayed with the core's trace on, as torch's snapshot: what a prediction's trace
(`amem predict --trace`, torch.cuda.memory._snapshot() under prediction) is.

Each alloc and free event is labelled by `describe(key)` -> (frames, user_metadata): the caller
knows what each of its program's keys was (prediction: the engine's AllocInfo); the blocks still
live at the end get their frames too. Recording starts at op `start` (a record window's start).
"""
from __future__ import annotations

from typing import Any, Callable

from .._C import CoreAllocator
from .program import ALLOC, FREE, POOL_BEGIN, POOL_END, RELEASE

Describe = Callable[[int], tuple[list[dict], str]]
_RING_SLACK = 4096   # trace ring entries beyond 4 per op (alloc/free and the segment events they cause)


class _SimAllocator:
    """What snapshot.build_snapshot reads from an Allocator: its core, its settings, its backend."""

    backend = "sim"

    def __init__(self, conf: str) -> None:
        self._core = CoreAllocator("sim", conf, 0)

    @property
    def settings(self) -> str:
        return self._core.settings


def _pool_op(core: Any, kind: int, pool: int) -> None:
    """A CUDA graph capture's pool scope (Note [captured pools]): every stream goes to the pool."""
    if kind == POOL_BEGIN:
        core.begin_allocate_to_pool((0, pool), [])
    elif kind == POOL_END:
        core.end_allocate_to_pool((0, pool))
    else:
        core.release_pool((0, pool))


def traced_snapshot(ops: list[tuple], describe: Describe, conf: str = "", start: int = 0) -> dict:
    """The program `ops` ((kind, key, size, stream)) re-run on a fresh sim core, recording from op
    `start`: torch's snapshot format, every event labelled by `describe`."""
    from ..snapshot import build_snapshot

    alloc = _SimAllocator(conf)
    core, live, order = alloc._core, {}, []
    for i, (kind, key, size, stream) in enumerate(ops):
        if i == start:
            core.start_trace(4 * (len(ops) - start) + _RING_SLACK)
        if kind == ALLOC:
            if key in live:
                core.free(live.pop(key))
            address = core.malloc(size, stream)
            if address:
                live[key] = address
                if i >= start:
                    order.append(key)
        elif kind == FREE:
            if key in live:
                core.free(live.pop(key))
        elif kind == RELEASE:
            core.empty_cache()
        else:
            _pool_op(core, kind, key)
    if start >= len(ops):
        core.start_trace(_RING_SLACK)
    snap = build_snapshot(alloc)
    _label(snap, describe, order, {a: k for k, a in live.items()})
    return snap


def _label(snap: dict, describe: Describe, order: list[int], final: dict[int, int]) -> None:
    """Frames and labels per event: the n-th alloc event is the n-th successful malloc."""
    by_addr: dict[int, int] = {}
    n = 0
    for ev in (snap["device_traces"] or [[]])[0]:
        if ev["action"] == "alloc":
            key = order[n]
            n += 1
            by_addr[ev["addr"]] = key
        elif ev["action"] in ("free_requested", "free_completed"):
            key = by_addr.get(ev["addr"])
        else:
            continue
        ev["frames"], ev["user_metadata"] = describe(key)
    for seg in snap["segments"]:
        for b in seg["blocks"]:
            if b["state"] != "inactive" and b["address"] in final:
                b["frames"] = describe(final[b["address"]])[0]


def describe_infos(infos: dict[int, Any]) -> Describe:
    """describe() from a table of objects with .frames ((file, line, name), innermost first) and
    .category / .module / .op (prediction's AllocInfo)."""
    def describe(key: Any) -> tuple[list[dict], str]:
        info = infos.get(key)
        frames = [{"filename": str(f[0]), "line": int(f[1]), "name": str(f[2])}
                  for f in (getattr(info, "frames", ()) or ())]
        parts = [getattr(info, "category", None), getattr(info, "module", None), getattr(info, "op", None)]
        return frames, " ".join(str(x) for x in parts if x) if info is not None else ""
    return describe
