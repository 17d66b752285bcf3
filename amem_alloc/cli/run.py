"""`amem run script.py args...` (or `-m module`): the script with amem as torch's CUDA allocator.

On a machine where no GPU is usable amem cannot be active: one line says so and why before the
script runs, and should the script then reach for CUDA, one line names its call instead of
torch's traceback.
"""
from __future__ import annotations

import argparse
import sys

from .. import user_script
from ..user_input import UsageError


def _explain_no_gpu(script: str):
    """user_script.run's `explain`: one line for the script's first CUDA call on a machine with no GPU."""
    def explain(err: BaseException) -> str | None:
        call = user_script.cuda_start_failed(err)
        if call is None:
            return None  # any other error is the script's own: its traceback
        return (f"amem run: the script needs a GPU: {call} (to predict its GPU memory on this machine: "
                f"amem predict -- python {script})")
    return explain


def command(args: argparse.Namespace) -> int:
    from ..cuda import enable, gpu_problem

    if not args.target:
        raise UsageError("give a script (amem run train.py args...) or -m module")
    target, rest = args.target[0], args.target[1:]
    user_script.check_target(target, args.module)
    enable(policy=args.policy)  # a bad policy, AMEM_CONF or AMEM_TRACE is amem's error, said before the script starts
    problem = gpu_problem()
    if problem is None:
        return user_script.run(target, rest, module=args.module)  # the script's errors stay the script's
    print(f"amem run: amem is not active: {problem}; the script runs on the CPU only", file=sys.stderr)
    script = "SCRIPT.py" if args.module else target  # amem predict takes a script's path, not -m
    return user_script.run(target, rest, module=args.module, explain=_explain_no_gpu(script))


def add(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="run a Python script with amem as torch's CUDA allocator")
    run.add_argument("-m", dest="module", action="store_true", help="run a module instead of a script")
    run.add_argument("--policy", help="the allocator policy to start from (default: AMEM_POLICY, else amem; "
                     "amem-defaults for torch's own decisions); AMEM_CONF overrides it key by key")
    run.add_argument("target", nargs=argparse.REMAINDER, help="script.py args... (or module args... with -m)")
    run.set_defaults(func=command)
