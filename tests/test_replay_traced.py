"""A program replayed with the core's trace on (amem_alloc/replay/traced.py, the C++ loop of Note [traced
replay]) makes the very snapshot the Python loop it replaced made: key reuse, frees of unknown keys,
size-0 requests, empty_cache, CUDA graph captures' pools, several streams and policies, recording from
the start, from the middle and from past the end. The old loop is kept with the tests, and only there, as the reference
(tests/traced_reference.py; benchmarks/bench_traced.py times the two side by side)."""
import random

import pytest
from traced_reference import loop_snapshot, timeless

from amem_alloc import _C
from amem_alloc.replay.program import ALLOC, FREE, POOL_BEGIN, POOL_END, POOL_RELEASE, RELEASE
from amem_alloc.replay.traced import describe_infos, traced_snapshot

MiB = 1 << 20


# ---------------------------------------------------------------------------- programs
class Info:
    """What prediction's AllocInfo offers describe_infos."""

    def __init__(self, key):
        self.frames = [("train.py", 10 + key % 7, f"step{key % 3}"), ("model.py", key, "forward")]
        self.category, self.module, self.op = ("activation", f"layers.{key % 4}", "aten.mm")


def small_program():
    """Key reuse (a live key allocated again), frees of keys never allocated or already freed, size 0,
    empty_cache between, three streams, small and large pools; then two CUDA graph captures (Note
    [captured pools]): one whose blocks are freed inside and after it before its pool is released,
    one whose block is still live when its pool is released."""
    return [(ALLOC, 1, 1000, 0), (ALLOC, 2, 3 * MiB, 0), (FREE, 1, 0, 0), (FREE, 99, 0, 0),
            (ALLOC, 2, 500, 0), (ALLOC, 3, 0, 0), (ALLOC, 4, 2000, 7), (RELEASE, 0, 0, 0),
            (FREE, 3, 0, 0), (ALLOC, 5, 12 * MiB, 0), (FREE, 4, 0, 0), (FREE, 4, 0, 0),
            (ALLOC, 1, 700, 9), (ALLOC, 6, 25 * MiB, 7), (RELEASE, 0, 0, 0), (FREE, 6, 0, 0),
            (ALLOC, 7, 1 << 20, 0), (ALLOC, 7, 1 << 21, 0), (RELEASE, 0, 0, 0),
            (POOL_BEGIN, 1, 0, 0), (ALLOC, 8, 4000, 9), (ALLOC, 9, 5 * MiB, 0), (FREE, 8, 0, 0),
            (POOL_END, 1, 0, 0), (ALLOC, 10, 1000, 0), (FREE, 9, 0, 0), (POOL_RELEASE, 1, 0, 0),
            (POOL_BEGIN, 2, 0, 0), (ALLOC, 11, 2 * MiB, 3), (POOL_END, 2, 0, 0), (POOL_RELEASE, 2, 0, 0)]


def random_program(n, seed):
    """n ops: allocs of new and of live keys, frees of live and unknown keys, a release now and then,
    and captures (a pool opened, closed, and released some time later)."""
    rng, ops, live, capture, ended = random.Random(seed), [], [], None, []
    sizes = (0, 1, 512, 4000, 100_000, 1 << 20, 3 * MiB, 15 * MiB, 40 * MiB)
    for _ in range(n):
        r = rng.random()
        if rng.random() < 0.02:
            op = _capture_op(rng, ops, capture, ended)
            ops.append(op)
            capture = op[1] if op[0] == POOL_BEGIN else None if op[0] == POOL_END else capture
            continue
        if r < 0.45 or not live:
            key = rng.choice(live) if live and rng.random() < 0.1 else rng.randrange(1 << 40)
            size = rng.choice(sizes) + rng.randrange(4096)
            ops.append((ALLOC, key, size, rng.choice((0, 0, 0, 5, 11))))
            live.append(key)
        elif r < 0.93:
            ops.append((FREE, live.pop(rng.randrange(len(live))), 0, 0))
        elif r < 0.97:
            ops.append((FREE, rng.randrange(1 << 40), 0, 0))
        else:
            ops.append((RELEASE, 0, 0, 0))
    return ops


def _capture_op(rng, ops, capture, ended):
    """The next op of the captures: end the open one, release an ended one, or open a new one."""
    if capture is not None:
        ended.append(capture)
        return (POOL_END, capture, 0, 0)
    if ended and rng.random() < 0.5:
        return (POOL_RELEASE, ended.pop(rng.randrange(len(ended))), 0, 0)
    return (POOL_BEGIN, 1 + sum(op[0] == POOL_BEGIN for op in ops), 0, 0)


PROGRAMS = {"small": small_program(), "random": random_program(4000, seed=1), "empty": []}
CASES = [("small", 0), ("small", 4), ("small", 12), ("small", 19), ("small", 22), ("small", 31), ("small", 40),
         ("random", 0), ("random", 1500), ("empty", 0)]


# ---------------------------------------------------------------------------- the same snapshot
@pytest.mark.parametrize("conf", ["", "expandable_segments:True", "max_split_size_mb:20"])
@pytest.mark.parametrize("name,start", CASES)
def test_the_c_loop_makes_the_snapshot_the_python_loop_made(name, start, conf):
    ops = PROGRAMS[name]
    describe = describe_infos({key: Info(key) for _, key, _, _ in ops})
    new, old = traced_snapshot(ops, describe, conf, start), loop_snapshot(ops, describe, conf, start)
    assert timeless(new) == timeless(old)


def test_every_alloc_from_start_is_labelled_and_live_blocks_get_their_frames():
    ops = small_program()
    snap = traced_snapshot(ops, describe_infos({key: Info(key) for _, key, _, _ in ops}), start=4)
    allocs = [ev for ev in snap["device_traces"][0] if ev["action"] == "alloc"]
    assert [ev["frames"][1]["line"] for ev in allocs] == [2, 4, 5, 1, 6, 7, 7, 8, 9, 10, 11]  # key 3: 0 bytes
    assert snap["amem"]["devices"][0]["dropped"] == 0
    live = [b for seg in snap["segments"] for b in seg["blocks"] if b["state"] != "inactive"]
    assert sorted(b["frames"][1]["line"] for b in live) == [1, 2, 5, 7, 10, 11]
    assert any(seg["segment_pool_id"] == (0, 2) for seg in snap["segments"])  # released with key 11 in it: kept


def test_bad_programs_are_refused_before_anything_runs():
    with pytest.raises(ValueError, match="unknown kind 3"):
        traced_snapshot([(ALLOC, 1, 1000, 0), (3, 0, 0, 0)], describe_infos({}))
    with pytest.raises(ValueError, match="not at -1"):
        traced_snapshot([(ALLOC, 1, 1000, 0)], describe_infos({}), start=-1)
    core = _C.CoreAllocator("sim", "", 0)
    with pytest.raises(ValueError, match="32-byte records"):
        core.replay_traced(b"\0" * 33, 0)
