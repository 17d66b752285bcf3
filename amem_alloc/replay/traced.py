"""A program replayed with the core's trace on, as torch's snapshot: what a prediction's trace
(`amem predict --trace`, torch.cuda.memory._snapshot() under prediction) is.

Each alloc and free event is labelled by `describe(key)` -> (frames, user_metadata): the caller
knows what each of its program's keys was (prediction: the engine's AllocInfo); the blocks still
live at the end get their frames too. Recording starts at op `start` (a record window's start).

The program runs in the core's C++ loop (`CoreAllocator.replay_traced`, Note [traced replay] in
csrc/core/replay.h: its rules for reused keys, unknown frees, size-0 requests and captured pools,
and the ring's size), which hands back the keys allocated from `start` on, in order, and the
keys live at the end: predictions can record millions of ops, and a binding call per op cost
about a microsecond each.
"""
from __future__ import annotations

from typing import Any, Callable

from .._C import CoreAllocator
from .program import ALLOC, FREE, pack

Describe = Callable[[int], tuple[list[dict], str]]


class _SimAllocator:
    """What snapshot.build_snapshot reads from an Allocator: its core, its settings, its backend."""

    backend = "sim"

    def __init__(self, conf: str) -> None:
        self._core = CoreAllocator("sim", conf, 0)

    @property
    def settings(self) -> str:
        return self._core.settings


def traced_snapshot(ops: list[tuple], describe: Describe, conf: str = "", start: int = 0) -> dict:
    """The program `ops` ((kind, key, size, stream): ALLOC, FREE, RELEASE and captured pools' POOL_BEGIN,
    POOL_END, POOL_RELEASE) re-run on a fresh sim core, recording from op `start`: torch's snapshot
    format, every event labelled by `describe`."""
    from ..snapshot import build_snapshot

    if start < 0:
        raise ValueError(f"amem: a trace starts at an op of the program, not at {start}")
    alloc = _SimAllocator(conf)
    order, live = alloc._core.replay_traced(pack(ops).tobytes(), start)
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


def event_ops(ops: list[tuple], events: list[dict], start: int = 0) -> list[int]:
    """The op of `ops` that made each event of its traced replay (traced_snapshot's device trace),
    by Note [traced replay]'s rules: the n-th alloc event is the n-th ALLOC of a size above 0 from
    op `start`; a free event is the next FREE (or ALLOC: a live key allocated again) of the key
    last allocated at that address; a segment event belongs to the op the replay was at. Ops
    come in order, so one pass: an op's number for a chart's x axis (`amem predict`'s "after
    allocator call N" is op N - 1)."""
    out, at, key_at = [], start, {}
    for ev in events:
        action = ev.get("action")
        if action == "alloc":
            at = _next_op(ops, at, lambda op: op[0] == ALLOC and op[2] > 0)
            key_at[ev.get("addr")] = ops[at][1] if at < len(ops) else None
        elif action in ("free_requested", "free_completed") and key_at.get(ev.get("addr")) is not None:
            key = key_at[ev.get("addr")]
            at = _next_op(ops, at, lambda op: op[0] in (ALLOC, FREE) and op[1] == key)
        out.append(min(at, max(len(ops) - 1, 0)))
        if action == "alloc":
            at += 1
    return out


def _next_op(ops: list[tuple], at: int, wanted: Callable[[tuple], bool], look: int = 1 << 16) -> int:
    """The first op from `at` that is `wanted` (within `look` ops); `at` itself when none is (a
    trace that does not follow the program: its events stay where they were)."""
    for i in range(at, min(len(ops), at + look)):
        if wanted(ops[i]):
            return i
    return at


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
