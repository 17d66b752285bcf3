"""The reference for amem_alloc/replay/traced.py: its Python loop as it was before the C++ loop
(Note [traced replay] in csrc/core/replay.h) replaced it, one binding call per op (commit 702dfe9).
tests/test_replay_traced.py compares the two snapshots; benchmarks/bench_traced.py times them."""
from __future__ import annotations

import pickle

from amem_alloc.replay.program import ALLOC, FREE, POOL_BEGIN, POOL_END, RELEASE
from amem_alloc.replay.traced import _label, _SimAllocator
from amem_alloc.snapshot import build_snapshot
from amem_alloc.snapshot_dump import PICKLE_PROTOCOL

RING_SLACK = 4096   # trace ring entries beyond 4 per op (alloc/free and the segment events they cause)


def _pool_op(core, kind: int, pool: int) -> None:
    """A CUDA graph capture's pool scope (Note [captured pools]): every stream goes to the pool."""
    if kind == POOL_BEGIN:
        core.begin_allocate_to_pool((0, pool), [])
    elif kind == POOL_END:
        core.end_allocate_to_pool((0, pool))
    else:
        core.release_pool((0, pool))


def loop_replay(ops: list[tuple], conf: str = "", start: int = 0) -> tuple[_SimAllocator, list, dict]:
    """The program run op by op on a fresh sim core, tracing from op `start`: (allocator, keys
    allocated from `start` on in order, key -> address of the blocks live at the end)."""
    alloc = _SimAllocator(conf)
    core, live, order = alloc._core, {}, []
    for i, (kind, key, size, stream) in enumerate(ops):
        if i == start:
            core.start_trace(4 * (len(ops) - start) + RING_SLACK)
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
        core.start_trace(RING_SLACK)
    return alloc, order, live


def loop_snapshot(ops: list[tuple], describe, conf: str = "", start: int = 0) -> dict:
    """traced_snapshot as it was: the loop above, then the same snapshot and labels."""
    alloc, order, live = loop_replay(ops, conf, start)
    snap = build_snapshot(alloc)
    _label(snap, describe, order, {a: k for k, a in live.items()})
    return snap


def timeless(snap: dict) -> bytes:
    """The snapshot as pickled bytes, its clock readings zeroed (two runs never share a clock)."""
    for trace in snap["device_traces"]:
        for ev in trace:
            ev["time_us"] = 0
    for device in snap["amem"]["devices"]:
        for ev in (device or {}).get("empty_cache", []):
            ev["time_us"] = 0
    return pickle.dumps(snap, protocol=PICKLE_PROTOCOL)
