"""A prediction's trace: a long program replayed with the core's trace on, the old Python loop against
the C++ loop (Note [traced replay] in csrc/core/replay.h), interleaved in one run.

    python benchmarks/bench_traced.py [--ops N | --program P.npz] [--start S] [--reps R] [--quick]

The program is amem's synthetic training pattern (amem_alloc.workloads.training_events), as many
steps as make N ops (a million by default), with an empty_cache every 50,000 ops, as a prediction
records it: (kind, key, size, stream) tuples; or a program saved with replay.Program.save (e.g. a
prediction's RecordedRun.program). Two figures per variant:

* replay:   the program run on a fresh sim core with the trace on from op S — the Python loop (one
            binding call per op, tests/traced_reference.py) against packing the tuples and one call
            of CoreAllocator.replay_traced;
* snapshot: the whole of traced_snapshot, the replay plus building torch's snapshot from the ring
            and labelling every event (the same code in both).

Each repetition times every variant once, in turn, after a garbage collection; a value is the
median, a ratio the median of the per-repetition ratios. Both the process's CPU time and the wall
time are taken: on a machine shared with other work the CPU time is the steadier of the two. Before
timing, both snapshots are checked to be the same (their clock readings aside): the replay is
checked, not only timed. The snapshot figure is mostly building the
snapshot from the ring (the core's trace as JSON, parsed, then torch's event dicts), which both
variants share: the replay is a small part of it.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # this checkout's amem_alloc; the reference loop lives with its tests

from traced_reference import loop_replay, loop_snapshot, timeless  # noqa: E402

from amem_alloc.replay.program import ALLOC, FREE, RELEASE, Program, pack  # noqa: E402
from amem_alloc.replay.traced import _SimAllocator, describe_infos, traced_snapshot  # noqa: E402
from amem_alloc.workloads import training_events  # noqa: E402

RELEASE_EVERY = 50_000


def program(n: int) -> list[tuple]:
    """n ops of the training pattern, an empty_cache every RELEASE_EVERY ops."""
    ops: list[tuple] = []
    steps = 1 + n // 400  # about 415 events a step
    for action, key, size, stream in training_events(steps=steps, seed=0):
        if len(ops) % RELEASE_EVERY == RELEASE_EVERY - 1:
            ops.append((RELEASE, 0, 0, 0))
        ops.append((ALLOC, key, size, stream) if action == "alloc" else (FREE, key, 0, 0))
        if len(ops) >= n:
            break
    return ops[:n]


def saved_program(path: str) -> list[tuple]:
    """A saved program's records as a prediction's (kind, key, size, stream) tuples."""
    return [(kind, key, size, stream) for key, size, stream, kind in Program.load(path).ops.tolist()]


def core_replay(ops: list[tuple], start: int) -> tuple:
    alloc = _SimAllocator("")
    return alloc._core.replay_traced(pack(ops).tobytes(), start)


def timed(fn) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of fn(), its result freed inside the measurement."""
    gc.collect()
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - cpu, time.perf_counter() - wall


def measure(ops: list[tuple], start: int, reps: int) -> dict:
    describe = describe_infos({})
    new, old = traced_snapshot(ops, describe, "", start), loop_snapshot(ops, describe, "", start)
    if timeless(new) != timeless(old):
        raise AssertionError("the C++ loop's snapshot differs from the Python loop's")
    events = len(new["device_traces"][0])
    del new, old
    variants = {"replay.python": lambda: loop_replay(ops, "", start),
                "replay.core": lambda: core_replay(ops, start),
                "snapshot.python": lambda: loop_snapshot(ops, describe, "", start),
                "snapshot.core": lambda: traced_snapshot(ops, describe, "", start)}
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for _ in range(reps):
        for name, fn in variants.items():  # interleaved: the machine's noise hits all alike
            samples[name].append(timed(fn))
    return {"ops": len(ops), "events": events, "samples": samples}


def _row(figure: str, old: list[tuple[float, float]], new: list[tuple[float, float]]) -> str:
    cells = [figure]
    for clock in (0, 1):  # CPU, wall
        a, b = [x[clock] for x in old], [x[clock] for x in new]
        ratio = statistics.median(x / y for x, y in zip(a, b))
        cells += [f"{statistics.median(a):.3f}", f"{statistics.median(b):.3f}", f"{ratio:.2f}x"]
    return "| " + " | ".join(cells) + " |"


def table(result: dict) -> list[str]:
    s = result["samples"]
    return [f"{result['ops']:,} ops, {result['events']:,} trace events; medians of {len(s['replay.core'])} "
            "interleaved repetitions, in seconds", "",
            "| figure | CPU: Python loop | CPU: C++ loop | CPU speed-up | wall: Python loop | wall: C++ loop "
            "| wall speed-up |", "|---|---|---|---|---|---|---|",
            _row("replay", s["replay.python"], s["replay.core"]),
            _row("snapshot", s["snapshot.python"], s["snapshot.core"])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=1_000_000)
    parser.add_argument("--program", help="a program saved with replay.Program.save, instead of the synthetic one")
    parser.add_argument("--start", type=int, default=0, help="the op the trace starts at")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="20,000 ops, one repetition (a smoke run)")
    args = parser.parse_args(argv)
    n, reps = (20_000, 1) if args.quick else (args.ops, args.reps)
    ops = saved_program(args.program) if args.program else program(n)
    print("\n".join(table(measure(ops, args.start, reps))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
