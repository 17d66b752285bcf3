"""One configuration of `amem compare`, in its own fresh process.

    python -m amem_alloc.compare.child replay --program P.npz --policy NAME --conf C --out R.json
    python -m amem_alloc.compare.child gpu --workload gpt --size 1 --policy NAME --native --out R.json

Design note
-----------
The allocator cannot change once CUDA has started, so every configuration runs in a process of
its own, started by compare/runner.py; each writes one JSON result with its pid, so the parent
(and the tests) can check that no two configurations shared a process.

`replay` runs a recorded program (compare/predicted_program.py) through the core on the sim backend
under one policy. `gpu` runs the workload for real: native policies with PYTORCH_CUDA_ALLOC_CONF
set by the parent (or unset), amem policies with AMEM_ENABLE=1 and AMEM_CONF. Both record the
allocator's trace (torch's _record_memory_history without stacks, or amem's ring) for the
timeline and, for torch's allocator, the allocated bytes at the reserved peak (amem reports that
figure itself); peaks, device mallocs and OOMs come from the allocator's own stats.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from .. import atomic_write, policies, replay
from ..replay.evaluation import PolicyRow, policy_row
from ..timeline import build_timeline, downsample

MAX_ENTRIES = 2_000_000  # trace ring for GPU runs (about 128 MB for amem)
TIMELINE_POINTS = 2000
TIMING_BUDGET_S = 0.5    # simulated runs: repeat the replay this long for a stable time


def _allocator_seconds(program: replay.Program, conf: str, limit_bytes: int, first: float) -> float:
    """The C++ loop's best time over a few runs (one run is at the mercy of the machine's load)."""
    best, spent = first, 0.0
    while spent < TIMING_BUDGET_S and spent < 20 * best:
        seconds = replay.replay_program(program.to_bytes(), conf, 1, limit_bytes)["seconds"]
        best, spent = min(best, seconds), spent + seconds
    return best


def _replay(args: argparse.Namespace) -> dict:
    """The policy's row (replay/evaluation.py), its time the best of a few runs."""
    program = replay.Program.load(args.program)
    row = policy_row(program, policies.Policy(args.policy, args.conf, ""), args.limit_bytes,
                     max_samples=TIMELINE_POINTS)
    row.seconds = _allocator_seconds(program, args.conf, args.limit_bytes, row.seconds)
    return dict(row.to_dict(), mode="simulated", timeline_unit="allocator call")


# ---------------------------------------------------------------------------- real GPU runs
def trace_timeline(snapshot: dict, device: int = 0) -> tuple[list[list[int]], int, int]:
    """(timeline [event, allocated, reserved], peak reserved, allocated at it) of one device of a
    fresh process's snapshot, as amem_alloc/timeline.py rebuilds it: a block is held until its
    free_completed; its size is amem's block size, or torch's request rounded to 512 B (torch's
    trace has no block sizes); reserved is exact. The timeline keeps at most about TIMELINE_POINTS
    points, the highs and lows among them."""
    tl = build_timeline(snapshot, device)
    allocated, reserved = tl.allocated[1:], tl.reserved[1:]  # one point per event (the first is the start)
    peak = max(reserved, default=0)
    at_peak = max((a for a, r in zip(allocated, reserved) if r == peak), default=0)
    keep = downsample(len(allocated), TIMELINE_POINTS, [allocated, reserved])
    return [[i, allocated[i], reserved[i]] for i in keep], peak, at_peak


def _start_recording(native: bool) -> None:
    if native:
        import torch

        torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES, context=None, stacks="python")
    else:
        from ..recording import record

        record(max_entries=MAX_ENTRIES)


def _finish(native: bool, out: Path, policy: str) -> tuple[dict, dict]:
    """(stats, snapshot) of device 0; the snapshot is also written next to the result."""
    import torch

    from ..devices import memory_stats
    from ..snapshot import save_snapshot
    from ..snapshot_dump import build_snapshot

    if native:
        stats, snap = torch.cuda.memory_stats(0), torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
    else:
        stats, snap = memory_stats(0), build_snapshot()
    save_snapshot(snap, out.with_name(f"trace-{policy}.pickle"))
    return stats, snap


def _gpu(args: argparse.Namespace) -> dict:
    if not args.native:  # AMEM_ENABLE=1 may have done it at start-up already; then this is a no-op
        from ..cuda import enable

        enable()
    import torch

    from .. import workloads
    from .predicted_program import _run_script

    if not torch.cuda.is_available():
        raise RuntimeError("amem compare: --mode real needs a CUDA device")
    _start_recording(args.native)
    times, last, oom = [], [time.perf_counter()], False

    def on_step(i: int) -> None:
        torch.cuda.synchronize()
        now = time.perf_counter()
        times.append(now - last[0])
        last[0] = now

    try:
        if args.script:
            _run_script(args.script, on_step, reraise=(torch.OutOfMemoryError,), steps=args.steps or 0)
        else:
            workloads.get(args.workload)(args.size, args.steps, "cuda", 0, on_step)
        torch.cuda.synchronize()
    except torch.OutOfMemoryError:
        oom = True
    stats, snap = _finish(args.native, Path(args.out), args.policy)
    timeline, _, at_peak = trace_timeline(snap)
    if not args.native:  # amem keeps the exact figure (block sizes, not rounded requests)
        from ..devices import fragmentation

        at_peak = fragmentation(0).allocated_bytes_at_reserved_peak
    row = PolicyRow(args.policy, args.conf, "", stats.get("allocated_bytes.all.peak", 0),
                    stats.get("reserved_bytes.all.peak", 0), at_peak, stats.get("num_device_alloc", 0),
                    stats.get("num_device_free", 0), stats.get("num_ooms", 0) + (0 if stats.get("num_ooms") else int(oom)),
                    timeline=timeline)
    return dict(row.to_dict(), mode="real", allocator="torch" if args.native else "amem", oom_raised=oom,
                steps=len(times), seconds_per_step=statistics.median(times[1:] or times) if times else None,
                step_seconds=times, device=torch.cuda.get_device_name(0), torch=torch.__version__,
                timeline_unit="trace event")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m amem_alloc.compare.child")
    sub = parser.add_subparsers(dest="what", required=True)
    rep = sub.add_parser("replay")
    rep.add_argument("--program", required=True)
    rep.add_argument("--limit-bytes", type=int, default=0)
    gpu = sub.add_parser("gpu")
    gpu.add_argument("--workload")
    gpu.add_argument("--size", type=int, default=1)
    gpu.add_argument("--steps", type=int)
    gpu.add_argument("--native", action="store_true", help="torch's own allocator (else amem)")
    gpu.add_argument("--script", nargs=argparse.REMAINDER)
    for p in (rep, gpu):
        p.add_argument("--policy", required=True)
        p.add_argument("--conf", default="")
        p.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    from .processes import die_with_parent

    die_with_parent()
    started = time.perf_counter()
    result = _replay(args) if args.what == "replay" else _gpu(args)
    result.update(policy=args.policy, conf=args.conf, pid=os.getpid(), wall_seconds=time.perf_counter() - started)
    atomic_write.write_text(args.out, json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
