"""`amem predict`: a script's or a bundled workload's GPU memory, predicted without a GPU.

    amem predict [--gpu NAME | --capacity-gb N] [--policy LIST] [--json PATH] [--trace PATH]
                 [--report PATH] -- python SCRIPT ARGS...
    amem predict --workload NAME [--size N] [--steps N] [...]

The script runs unchanged in this process (runpy, sys.argv set, as __main__) on fake CUDA
tensors. Exit status: 0 with a prediction; the script's own status if it exits non-zero or
raises (its traceback printed as Python would); 3 when it needs a real value (DataDependentError:
one line naming the file and line); 2 for bad arguments (one line).
"""
from __future__ import annotations

import argparse
import runpy
import sys
import traceback
from pathlib import Path
from typing import Any

from .. import policies as policies_mod

EXIT_BAD_INPUT = 2
EXIT_DATA_DEPENDENT = 3
PYTHONS = ("python", "python3")


class _ScriptFailed(Exception):
    """The user's script raised or exited non-zero: its own exit status, its error already printed."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def _fail(message: str) -> None:
    print(f"amem predict: {message}", file=sys.stderr)
    raise SystemExit(EXIT_BAD_INPUT)


def _script(target: list[str]) -> list[str] | None:
    """`-- python train.py args` -> ["train.py", "args"]."""
    target = target[1:] if target and target[0] == "--" else target
    if target and Path(target[0]).name.startswith(PYTHONS) and not target[0].endswith(".py"):
        target = target[1:]
    if not target:
        return None
    if target[0] == "-m":
        raise ValueError("give a script path (-- python train.py ...), not -m module")
    if not target[0].endswith(".py"):
        raise ValueError(f"{target[0]!r} is not a Python script; use -- python script.py args...")
    if not Path(target[0]).is_file():
        raise ValueError(f"{target[0]}: no such script")
    return target


def _print_user_traceback(err: BaseException, script: str) -> None:
    """The traceback Python would print for the script: from the script's first frame on."""
    tb = err.__traceback__
    wanted = str(Path(script).resolve())
    while tb is not None and str(Path(tb.tb_frame.f_code.co_filename).resolve()) != wanted:
        tb = tb.tb_next
    traceback.print_exception(type(err), err, tb or err.__traceback__, file=sys.stderr)


def _run_script(argv: list[str], data_dependent: type) -> None:
    script = argv[0]
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = list(argv)
    sys.path.insert(0, str(Path(script).resolve().parent))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_:
        code = exit_.code
        if code not in (None, 0):
            if not isinstance(code, int):
                print(code, file=sys.stderr)
                code = 1
            raise _ScriptFailed(code) from None
    except data_dependent:
        raise
    except Exception as err:  # noqa: BLE001 - the user's own error: shown as theirs, not amem's
        _print_user_traceback(err, script)
        raise _ScriptFailed(1) from None
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


def _run_workload(run: Any, name: str, size: int, steps: int | None) -> None:
    from .. import workloads

    workloads.get(name)(size, steps, "cuda", 0, lambda i: run.marker("step"))


def _data_dependent_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    where = [getattr(err, a, None) for a in ("filename", "lineno")]
    if where[0] and where[1] and f"{where[0]}:{where[1]}" not in text and str(where[0]) not in text:
        text = f"{where[0]}:{where[1]}: {text}"
    return "amem predict: " + text


def predict_command(args: argparse.Namespace) -> int:
    from . import api

    script = _script(args.target)
    if (args.workload is None) == (script is None):
        raise ValueError("give --workload NAME, or -- python script.py args... (one of the two)")
    if args.size < 1 or (args.steps is not None and args.steps < 1):
        raise ValueError("--size and --steps must be integers >= 1")
    gpu = api.resolve_gpu(args.gpu, args.capacity_gb)
    policies = api.resolve_policies(args.policy)
    for path in (args.json, args.trace, args.report):
        if path and not Path(path).resolve().parent.is_dir():
            raise ValueError(f"{path}: its folder does not exist")
    _, data_dependent = api.engine()
    target = f"script {' '.join(script)}" if script else f"workload {args.workload} (size {args.size})"
    try:
        with api.predicting(gpu, policies=policies, target=target) as run:
            if script:
                _run_script(script, data_dependent)
            else:
                _run_workload(run, args.workload, args.size, args.steps)
    except _ScriptFailed as failed:
        print(f"amem predict: the script failed (exit status {failed.status}); no prediction", file=sys.stderr)
        return failed.status
    except data_dependent as err:
        print(_data_dependent_line(err), file=sys.stderr)
        return EXIT_DATA_DEPENDENT
    result = run.result
    print(result.format_text())
    written = []
    try:
        if args.json:
            written.append(result.write_json(args.json))
        if args.trace:
            written.append(result.write_trace(args.trace))
        if args.report:
            written.append(result.write_report(args.report))
    except OSError as err:  # atomic_write's WriteError names the path; nothing half-written is left there
        raise ValueError(str(err) if err.filename else f"cannot write an output: {err.strerror or err}") from None
    if written:
        print("\nwrote " + ", ".join(str(p) for p in written))
    return 0


def _command(args: argparse.Namespace) -> int:
    try:
        return predict_command(args)
    except ValueError as err:  # bad input: one line
        msg = str(err)
        print(msg if msg.startswith("amem") else f"amem predict: {msg}", file=sys.stderr)
        return EXIT_BAD_INPUT


def add_command(sub: argparse._SubParsersAction) -> None:
    from .. import workloads
    from . import gpus

    p = sub.add_parser("predict", help="predict a script's or workload's GPU memory under every allocator "
                       "policy, without a GPU",
                       description="Runs the code on fake CUDA tensors (no GPU, no compute), then replays its "
                       "allocations under each policy. Cards (--gpu):\n" + gpus.describe() + "\n\nPolicies:\n"
                       + policies_mod.describe() + "\n\nWorkloads: " + ", ".join(workloads.WORKLOADS),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    where = p.add_mutually_exclusive_group()
    where.add_argument("--gpu", help=f"the card to fit (default {gpus.DEFAULT}); see the list above")
    where.add_argument("--capacity-gb", type=float, help="instead of --gpu: usable device memory in GiB")
    p.add_argument("--policy", help="comma-separated policy names, 'all', or conf:<AMEM_CONF> (last); default: "
                   + ",".join(policies_mod.DEFAULT_COMPARE))
    p.add_argument("--workload", choices=list(workloads.WORKLOADS), help="a bundled workload instead of a script")
    p.add_argument("--size", type=int, default=1, help="the workload's size knob (default 1)")
    p.add_argument("--steps", type=int, help="the workload's steps (default: the workload's)")
    p.add_argument("--json", help="write the result as JSON")
    p.add_argument("--trace", help="write the predicted run as a torch memory snapshot (pickle)")
    p.add_argument("--report", help="write the HTML report of the predicted run")
    p.add_argument("target", nargs=argparse.REMAINDER, help="-- python script.py args...")
    p.error = _fail  # type: ignore[method-assign]  - one line, no usage dump
    p.set_defaults(func=_command)
