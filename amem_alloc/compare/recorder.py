"""Record a workload's allocation sequence on the CPU, once, for replay under every policy.

Design note
-----------
Without a GPU there is no CUDA allocator to watch, but the workload's tensors still come and
go in the same order on the CPU. torch's profiler with profile_memory=True reports every call
into the CPU allocator: the address, the signed byte count (negative for a free) and a
nanosecond time stamp. Allocations are paired with their frees by address in time order,
which gives each block a stable identity (an address is only reused after its free); each
becomes a key of a replay program (replay.OPS), all on stream 0. Blocks that were live before
profiling began (freed with no allocation) are left out; the workload is built inside the
profiler, so there are none but torch's own.

What this sees is the CPU kernels' allocations: the same tensors as on a GPU, but CPU kernels
may use other temporaries than CUDA kernels (and no cuBLAS workspaces), so a simulated figure
is an estimate of the GPU's, not a measurement (docs/replay.md).

Used as `python -m amem_alloc.compare.recorder --workload gpt --out DIR` (or `--script
script.py args...`), always in a fresh process: it writes DIR/program.npz and
DIR/recording.json (what ran, the step boundaries, the CPU time per step).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from .. import replay

PROFILER_API = "torch.profiler kineto_results.experimental_event_tree, _ExtraFields_Allocation"


def _allocation_events(prof) -> list[tuple[int, int, int, int]]:
    """(time ns, order, ptr, signed bytes) of every CPU allocator call the profiler saw."""
    out: list[tuple[int, int, int, int]] = []
    stack = list(reversed(prof.profiler.kineto_results.experimental_event_tree()))
    while stack:
        node = stack.pop()
        extra = node.extra_fields
        if type(extra).__name__ == "_ExtraFields_Allocation" and str(extra.device) == "cpu":
            out.append((node.start_time_ns, len(out), extra.ptr, extra.alloc_size))
        stack.extend(reversed(node.children))
    out.sort()
    return out


def program_from_allocations(events: list[tuple[int, int, int, int]]) -> tuple[replay.Program, list[int], int]:
    """(program, time ns of each op, frees of blocks allocated before recording)."""
    live: dict[int, int] = {}
    ops, times, orphans, next_key = [], [], 0, 0
    for t, _, ptr, size in events:
        if size > 0:
            next_key += 1
            live[ptr] = next_key
            ops.append((replay.ALLOC, next_key, size, 0))
        elif size < 0:
            key = live.pop(ptr, None)
            if key is None:
                orphans += 1
                continue
            ops.append((replay.FREE, key, 0, 0))
        else:
            continue
        times.append(t)
    return replay.Program(replay.pack(ops)), times, orphans


def _record(target, *args) -> tuple[list, list[int], float, object]:
    """Runs target(*args, on_step=...) under the profiler: (events, step time stamps ns, seconds, result)."""
    from torch.profiler import ProfilerActivity, profile

    marks: list[int] = []
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        started = time.perf_counter()
        result = target(*args, on_step=lambda i: marks.append(time.time_ns()))
        seconds = time.perf_counter() - started
    return _allocation_events(prof), marks, seconds, result


SCRIPT_FAILED = "script_failed.json"  # written when the user's script fails: its exit status


def _run_script(argv: list[str], on_step=None, reraise: tuple = ()) -> dict:
    """Runs the user's script as Python would (user_script.run); a step is an optimizer.step().

    ScriptFailed if it exits non-zero; its traceback is on stderr by then.
    """
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from .. import user_script

    script, rest = argv[0], argv[1:]
    steps = [0]

    def count(optimizer, args, kwargs) -> None:
        steps[0] += 1
        if on_step is not None:
            on_step(steps[0])

    hook = register_optimizer_step_post_hook(count)
    try:
        status = user_script.run(script, rest, reraise=reraise)
    finally:
        hook.remove()
    if status != 0:
        raise user_script.ScriptFailed(script, status)
    return {"script": script, "args": rest, "optimizer_steps": steps[0]}


def record(out_dir: Path, workload: str | None, size: int, steps: int | None, script: list[str] | None) -> dict:
    """Records one run into out_dir; returns the recording's description (also written as JSON)."""
    import torch

    from .. import workloads

    torch.manual_seed(0)
    if script:
        events, marks, seconds, info = _record(_run_script, script)
    else:
        events, marks, seconds, info = _record(workloads.get(workload), size, steps, "cpu", 0)
    program, times, orphans = program_from_allocations(events)
    step_ops = [int(np.searchsorted(np.asarray(times, dtype=np.int64), m, side="right")) for m in marks]
    program.save(out_dir / "program.npz")
    meta = {"workload": workload, "script": script, "size": size, "info": info, "pid": os.getpid(),
            "method": f"CPU run under the profiler ({PROFILER_API}); allocations paired with frees by address",
            "ops": len(program), "allocations": int((program.ops["kind"] == replay.ALLOC).sum()),
            "orphan_frees": orphans, "step_ops": step_ops, "steps": len(marks),
            "cpu_seconds": seconds, "seconds_per_step": seconds / len(marks) if marks else None,
            "torch": torch.__version__}
    (out_dir / "recording.json").write_text(json.dumps(meta, indent=1))
    return meta


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m amem_alloc.compare.recorder")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--workload")
    parser.add_argument("--size", type=int, default=1)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--script", nargs=argparse.REMAINDER, help="script.py args... (instead of --workload)")
    args = parser.parse_args(argv)
    if not args.workload and not args.script:
        parser.error("give --workload NAME or --script script.py args...")
    args.out.mkdir(parents=True, exist_ok=True)
    from ..user_script import ScriptFailed

    try:
        record(args.out, args.workload, args.size, args.steps, args.script)
    except ScriptFailed as failed:
        (args.out / SCRIPT_FAILED).write_text(json.dumps({"script": failed.script, "status": failed.status}))
        return failed.status or 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
