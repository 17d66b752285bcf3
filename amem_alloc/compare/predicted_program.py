"""Record a workload's CUDA allocation sequence without a GPU, once, for replay under every policy.

Design note
-----------
Without a GPU there is no CUDA allocator to watch, so the workload runs under prediction
(amem_alloc.predict): its CUDA tensors are fake (no compute, no device memory) and the engine
records what PyTorch's CUDA caching allocator would be asked — every storage's requested bytes,
stream and free, in order, including what CUDA kernels allocate and CPU kernels do not (cuBLAS
workspaces, fused dropout masks, attention backends; docs/predict.md). The sequence becomes a
replay program (replay.OPS); the workload's on_step calls become step boundaries (op indices).

Code that needs a tensor's value (loss.item() deciding what to do next) cannot be predicted: the
recording stops with the engine's one-line DataDependentError naming the file and line, and
`amem compare` reports it; run such code on a GPU (`--mode real`).

Used as `python -m amem_alloc.compare.predicted_program --workload gpt --out DIR` (or `--script
script.py args...`, stopped after `--steps N` optimizer steps as amem predict stops it), always
in a fresh process: it writes DIR/program.npz and DIR/recording.json (what ran, the step
boundaries, the recording's time), and DIR/steps_done as it goes (the parent's progress). Its
stdout is the script's own output and nothing else.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from .. import atomic_write, replay

METHOD = "prediction: fake CUDA tensors (amem_alloc.predict), the allocations CUDA's caching allocator would receive"


SCRIPT_FAILED = "script_failed.json"  # written when the user's script fails: its exit status
INTERRUPTED = "interrupted"           # written when a KeyboardInterrupt stopped the recording
AMEM_FAILED = "amem_failed.json"      # written when amem itself failed inside the script: its one line
STEPS_DONE = "steps_done"             # the optimizer steps recorded so far, for the parent's progress


class _Enough(BaseException):
    """Raised into the script after its last step (--steps): a BaseException, so the script's own
    `except Exception` does not catch it."""


def _run_script(argv: list[str], on_step=None, reraise: tuple = (), steps: int = 0, amems=None) -> dict:
    """Runs the user's script as Python would (script_steps.run_steps); a step is an optimizer.step().
    After `steps` steps (0: none) the script is stopped there. ScriptFailed if it exits non-zero
    (its traceback is on stderr by then); KeyboardInterrupt goes on; amem's own failure inside the
    script (`amems`, predict/failures.py) is raised as failures.AmemFailure, not as the script's.
    """
    from .. import script_steps, user_script

    done = [0]

    def step(n: int) -> None:
        done[0] = n
        if on_step is not None:
            on_step(n)
        if steps and n >= steps:
            raise _Enough

    try:
        made = script_steps.run_steps(argv, step, (*reraise, _Enough, KeyboardInterrupt), amems=amems)
    except _Enough:
        made = done[0]
    _, args, _ = user_script.target_of(argv)
    return {"script": user_script.name_of(argv), "args": args, "optimizer_steps": made,
            "stopped_after_steps": steps if steps and made >= steps else None}


def _count_step(out_dir: Path, n: int) -> None:
    """The parent's progress: the steps recorded so far (a file it reads while it waits)."""
    atomic_write.write_text(out_dir / STEPS_DONE, str(n))


def steps_done(out_dir: Path) -> int:
    """What _count_step wrote last (0 before the first step)."""
    try:
        return int((out_dir / STEPS_DONE).read_text())
    except (OSError, ValueError):
        return 0


def record(out_dir: Path, workload: str | None, size: int, steps: int | None, script: list[str] | None) -> dict:
    """Records one predicted run into out_dir; returns the recording's description (also written as JSON)."""
    import torch

    from .. import workloads
    from ..predict.api import predicting
    from ..predict.engine.values import DataDependentError
    from ..predict.script import amems_failure_of

    def on_step(i: int) -> None:
        run.marker("step")
        _count_step(out_dir, i)

    started = time.perf_counter()
    from ..user_script import name_of

    with predicting(policies=[], target=workload or name_of(script), analyse=False) as run:
        if script:  # a value read is prediction's limit, not the script's error
            info = _run_script(script, on_step, reraise=(DataDependentError,), steps=steps or 0,
                               amems=amems_failure_of(script, run))
        else:
            info = workloads.get(workload)(size, steps, "cuda", 0, on_step)
    seconds = time.perf_counter() - started
    program = run.recorded.program
    program.save(out_dir / "program.npz")
    step_ops = [i for i, name in run.recording.markers if name == "step"]
    meta = {"workload": workload, "script": script, "size": size, "info": info, "pid": os.getpid(),
            "method": METHOD, "ops": len(program), "allocations": int((program.ops["kind"] == replay.ALLOC).sum()),
            "step_ops": step_ops, "steps": len(step_ops), "record_seconds": seconds, "torch": torch.__version__}
    atomic_write.write_text(out_dir / "recording.json", json.dumps(meta, indent=1))
    return meta


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m amem_alloc.compare.predicted_program")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--workload")
    parser.add_argument("--size", type=int, default=1)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--script", nargs=argparse.REMAINDER, help="script.py args... (instead of --workload)")
    args = parser.parse_args(argv)
    if not args.workload and not args.script:
        parser.error("give --workload NAME or --script script.py args...")
    from .processes import die_with_parent

    die_with_parent()
    from ..predict.engine.values import DataDependentError

    args.out.mkdir(parents=True, exist_ok=True)
    from ..predict.failures import AmemFailure
    from ..user_script import ScriptFailed

    try:
        record(args.out, args.workload, args.size, args.steps, args.script)  # stdout is the script's alone
    except DataDependentError as err:  # the parent shows this last line
        print(f"cannot predict this code: {str(err).splitlines()[0]}", file=sys.stderr)
        return 3
    except ScriptFailed as failed:  # the script's own error: its traceback is on stderr already
        (args.out / SCRIPT_FAILED).write_text(json.dumps({"script": failed.script, "status": failed.status}))
        return failed.status or 1
    except AmemFailure as failure:  # amem's, not the script's: the parent prints its one line
        atomic_write.write_text(args.out / AMEM_FAILED, json.dumps({"line": str(failure), "details": failure.details}))
        return 4
    except KeyboardInterrupt:  # the parent says "interrupted", as every command does
        (args.out / INTERRUPTED).write_text("")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
