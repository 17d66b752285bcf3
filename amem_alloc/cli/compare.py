"""`amem compare`: every policy on a workload or a script, one process each (amem_alloc/compare).

    amem compare --workload gpt [--size N] [--policy ...] [--mode auto|real|simulated]
    amem compare [--steps N] -- python train.py args...   (stopped after N optimizer steps, default 5)

It shows its progress on a terminal (the recording's steps, then the runs), ends its child
processes however it ends (compare/processes.py), and prints the script's own output, then its
table; compare.html plots without matplotlib.
"""
from __future__ import annotations

import argparse
import sys

from .. import policies as policies_mod
from .. import user_input, user_script
from . import exit_status, parser


def command(args: argparse.Namespace) -> int:
    from ..compare import compare, table

    script = parser.script_argv(args.target)
    if (args.workload is None) == (script is None):
        raise ValueError("amem compare: give --workload NAME, or -- python script.py args... (one of the two)")
    if args.workload is not None and args.steps == 0:
        raise ValueError("amem compare: --steps 0 runs a script to its end; a workload takes --steps >= 1")
    policies = policies_mod.parse_list(args.policy) if args.policy else None
    if args.out:
        user_input.output_folder(args.out)
    if args.mode == "real":
        from ..compare.runner import gpu_problem

        problem = gpu_problem()
        if problem:
            raise user_input.UsageError(f"--mode real needs a GPU: {problem}; use --mode simulated (or auto, "
                                        "which picks simulated here)")
    if script:
        target, _, module = user_script.target_of(script)
        user_script.check_target(target, module=module)
    try:
        result = compare(workload=args.workload, script=script, size=args.size, steps=args.steps,
                         policies=policies, mode=args.mode, out_dir=args.out, progress=not args.no_progress)
    except user_script.ScriptFailed as failed:  # its traceback is above; its exit status is amem compare's
        print(f"amem compare: {failed.script} exited with status {failed.status} (its output is above); "
              "nothing was compared", file=sys.stderr)
        return failed.status
    except Exception as err:  # amem failed inside the script (predict/failures.py): amem's line, not the script's
        from ..predict.failures import AmemFailure   # (torch is loaded only where a script was predicted)

        if not isinstance(err, AmemFailure):
            raise
        print(f"amem compare: {err}; nothing was compared", file=sys.stderr)
        return exit_status.NOT_MODELLED
    for row in result.rows:
        if row.get("error") and row.get("stderr"):
            print(f"--- {row['policy']}: the run's stderr ---\n{row['stderr'].rstrip()}", file=sys.stderr)
    print(table.format_text(result))
    print("\nwrote " + ", ".join(str(p) for p in result.files.values()))  # the page's plot needs no matplotlib
    return exit_status.FAILED if any(r.get("error") for r in result.rows) else exit_status.OK


def add(sub: argparse._SubParsersAction) -> None:
    from .. import workloads
    from ..compare.runner import MODES

    cmp_ = sub.add_parser("compare", help="run a workload under torch's allocator and amem's policies, "
                          "each in a fresh process (simulated without a GPU)",
                          description="Workloads: " + ", ".join(workloads.WORKLOADS) + ". Policies:\n"
                          + policies_mod.describe(), formatter_class=argparse.RawDescriptionHelpFormatter)
    cmp_.add_argument("--workload", choices=list(workloads.WORKLOADS))
    cmp_.add_argument("--size", type=parser.int_up_to(workloads.MAX_SIZE), default=1,
                      help="the workload's size knob (default 1: CPU-sized)")
    cmp_.add_argument("--steps", type=parser.count_up_to(workloads.MAX_STEPS),
                      help="a workload's steps (default: the workload's); a script is stopped after this many "
                      "optimizer steps, as amem predict stops it (default 5; 0: run it to its end)")
    parser.add_policy_option(cmp_, ",".join(policies_mod.DEFAULT_COMPARE))
    cmp_.add_argument("--mode", choices=MODES, default="auto", help="real needs a GPU; auto picks real when one is there")
    cmp_.add_argument("--out", help="output folder (default: amem-compare/<workload or script name>)")
    cmp_.add_argument("--no-progress", action="store_true", help="no progress bar")
    cmp_.add_argument("target", nargs=argparse.REMAINDER, help="-- python script.py args... (instead of --workload)")
    cmp_.set_defaults(func=command)

