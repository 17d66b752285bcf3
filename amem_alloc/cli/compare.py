"""The `amem replay` and `amem compare` subcommands (registered by amem_alloc/cli.py).

    amem replay TRACE [--policy torch,amem,...] [--device N] [--json OUT] [--plot OUT.png]
    amem compare --workload gpt [--size N] [--policies ...] [--mode auto|real|simulated]
    amem compare -- python train.py args...
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .. import atomic_write
from .. import policies as policies_mod
from .. import usage

PYTHONS = ("python", "python3")


def _policy_names(text: str | None) -> list[str] | None:
    return [p.name for p in policies_mod.parse_list(text)] if text else None


def _replay(args: argparse.Namespace) -> int:
    from . import trace_replay

    for option in ("json", "plot"):
        if getattr(args, option):
            usage.output_file(getattr(args, option), f"--{option}")
    if args.plot:
        usage.require_module("matplotlib", "--plot")  # said before the replay, not after it
    usage.input_file(args.trace, "a snapshot pickle or a program .npz written by amem compare")
    usage.apply_trace_limit(args)
    report = trace_replay.replay_trace(args.trace, _policy_names(args.policy), args.device,
                                       limit_bytes=int(args.limit_gb * (1 << 30)))
    print(trace_replay.format_text(report))
    if args.json:
        atomic_write.write_text(args.json, json.dumps(report.to_dict(), indent=1))
        print(f"\nwrote {args.json}")
    if args.plot:
        print("wrote " + ", ".join(str(p) for p in trace_replay.write_plot(report, args.plot)))
    return 0


def _script(target: list[str]) -> list[str] | None:
    """`-- python train.py args` -> ["train.py", "args"]; the script runs in amem's own interpreter."""
    target = target[1:] if target and target[0] == "--" else target
    if target and Path(target[0]).name.startswith(PYTHONS) and not target[0].endswith(".py"):
        target = target[1:]
    if target and target[0] == "-m":
        raise ValueError("amem compare: give a script path (python train.py ...), not -m module")
    if target and not target[0].endswith(".py"):
        raise ValueError(f"amem compare: {target[0]!r} is not a Python script; use -- python script.py args...")
    return target or None


def _compare(args: argparse.Namespace) -> int:
    from . import compare, table

    script = _script(args.target)
    if (args.workload is None) == (script is None):
        raise ValueError("amem compare: give --workload NAME, or -- python script.py args... (one of the two)")
    policies = policies_mod.parse_list(args.policies) if args.policies else None
    if args.out:
        usage.output_folder(args.out)
    if args.mode == "real":
        from .runner import gpu_problem

        problem = gpu_problem()
        if problem:
            raise usage.UsageError(f"--mode real needs a GPU: {problem}; use --mode simulated (or auto, which "
                                   "picks simulated here)")
    if script:
        from .. import user_script

        user_script.check_target(script[0], module=False)
    from ..user_script import ScriptFailed

    try:
        result = compare(workload=args.workload, script=script, size=args.size, steps=args.steps,
                         policies=policies, mode=args.mode, out_dir=args.out, progress=not args.no_progress)
    except ScriptFailed as failed:  # its traceback is above; its exit status is amem compare's
        print(f"amem compare: {failed.script} exited with status {failed.status} (its output is above); "
              "nothing was compared", file=sys.stderr)
        return failed.status
    for row in result.rows:
        if row.get("error") and row.get("stderr"):
            print(f"--- {row['policy']}: the run's stderr ---\n{row['stderr'].rstrip()}", file=sys.stderr)
    print(table.format_text(result))
    print("\nwrote " + ", ".join(str(p) for p in result.files.values()))
    if "png" not in result.files:
        try:
            usage.require_module("matplotlib", "compare.png")
        except usage.UsageError as missing:  # optional: the table, JSON and page stand without it
            print(f"amem compare: no {missing}", file=sys.stderr)
    return 0 if not any(r.get("error") for r in result.rows) else 1


def add_commands(sub: argparse._SubParsersAction) -> None:
    from .. import workloads
    from .runner import MODES

    rep = sub.add_parser("replay", help="replay a memory trace through amem's core under allocator policies",
                         description="Replays a snapshot (torch.cuda.memory._dump_snapshot, amem's, or a program "
                         "recorded by amem compare) on the sim backend. Policies:\n" + policies_mod.describe(),
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    rep.add_argument("trace", help="a snapshot pickle (- for standard input), or a .npz program")
    rep.add_argument("--policy", help="comma-separated policy names, 'all', or conf:<AMEM_CONF> (last); "
                     "default: the policy emulating the trace's own allocator settings")
    rep.add_argument("--device", type=usage.device_index, help="only this device")
    rep.add_argument("--limit-gb", type=usage.capacity_gb, default=0, help="simulated device capacity in GiB (0: unlimited)")
    rep.add_argument("--json", help="write the full report (timelines included) as JSON")
    rep.add_argument("--plot", help="write allocated/reserved over time as PNG")
    usage.add_trace_limit(rep)
    rep.set_defaults(func=_replay)
    cmp_ = sub.add_parser("compare", help="run a workload under torch's allocator and amem's policies, "
                          "each in a fresh process (simulated without a GPU)",
                          description="Workloads: " + ", ".join(workloads.WORKLOADS) + ". Policies:\n"
                          + policies_mod.describe(), formatter_class=argparse.RawDescriptionHelpFormatter)
    cmp_.add_argument("--workload", choices=list(workloads.WORKLOADS))
    cmp_.add_argument("--size", type=usage.int_up_to(workloads.MAX_SIZE), default=1,
                      help="the workload's size knob (default 1: CPU-sized)")
    cmp_.add_argument("--steps", type=usage.int_up_to(workloads.MAX_STEPS), help="steps to run (default: the workload's)")
    cmp_.add_argument("--policies", help="comma-separated policy names, 'all', or conf:<AMEM_CONF> (last); "
                      "default: " + ",".join(policies_mod.DEFAULT_COMPARE))
    cmp_.add_argument("--mode", choices=MODES, default="auto", help="real needs a GPU; auto picks real when one is there")
    cmp_.add_argument("--out", help="output folder (default: amem-compare/<workload or script name>)")
    cmp_.add_argument("--no-progress", action="store_true", help="no progress bar")
    cmp_.add_argument("target", nargs=argparse.REMAINDER, help="-- python script.py args... (instead of --workload)")
    cmp_.set_defaults(func=_compare)


def main(argv: list[str] | None = None) -> int:  # for tests: the two commands alone
    parser = usage.Parser(prog="amem")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
