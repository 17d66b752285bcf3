"""`amem fit`: the largest value of a script's integer argument with which the run fits a card,
per allocator policy, by bisection over predictions (fit.py).

    amem fit --gpu NAME --arg NAME [--across NAME=V1,V2,...] [--lo N] [--hi N] [--policy LIST]
             [--steps N] [--timeout S] [--json PATH] -- python SCRIPT ARGS...

Exit status (cli/main.py's convention): 0 with an answer; 2 for bad arguments, and when there is no answer to find (the run
fails or does not fit at --lo, or its memory does not grow with the argument): one line each.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import policies as policies_mod
from . import exit_status


def _fail(message: str) -> None:
    print(f"amem fit: {message}", file=sys.stderr)
    raise SystemExit(exit_status.BAD_INPUT)


def fit_command(args: argparse.Namespace) -> int:
    from ..predict import fit as fit_mod
    from .parser import existing_script as _script

    script = _script(args.target)
    if script is None:
        raise ValueError("give the script to run: -- python script.py args...")
    if not args.arg.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"--arg {args.arg!r}: give the argument's name without dashes, e.g. --arg batch_size")
    for out in (args.json, args.report):
        if out and not Path(out).resolve().parent.is_dir():
            raise ValueError(f"{out}: its folder does not exist")
    if args.report and not args.across:
        raise ValueError("--report draws the frontier of --across: give --across NAME=V1,V2,...")
    print(f"amem fit: searching --{args.arg} from {args.lo} (each trial is one prediction; the script's own "
          "output is not shown)", flush=True)
    if args.across:
        return _frontier(args, script, fit_mod)
    result = fit_mod.fit(script, args.arg, gpu=args.gpu, capacity_gb=args.capacity_gb, policies=args.policy,
                         lo=args.lo, hi=args.hi, steps=args.steps, timeout=args.timeout,
                         progress=lambda line: print(line, flush=True))
    from ..report.prediction_text import format_fit

    print(format_fit(result))
    if args.json:
        print(f"\nwrote {result.write_json(args.json)}")
    return 0


def _across(text: str) -> tuple[str, list[int]]:
    """--across NAME=V1,V2,...: the second argument and its values."""
    name, eq, values = text.partition("=")
    try:
        numbers = [int(v) for v in values.split(",") if v.strip()]
    except ValueError:
        numbers = []
    if not eq or not name.replace("_", "").replace("-", "").isalnum() or not numbers:
        raise ValueError(f"--across {text!r}: give NAME=V1,V2,... (integers), e.g. --across max_new_tokens=256,4096")
    return name, numbers


def _frontier(args: argparse.Namespace, script: list[str], fit_mod: object) -> int:
    from ..report.prediction_text import format_frontier

    across, values = _across(args.across)
    result = fit_mod.frontier(script, args.arg, across, values, gpu=args.gpu, capacity_gb=args.capacity_gb,
                              policies=args.policy, lo=args.lo, hi=args.hi, steps=args.steps,
                              timeout=args.timeout, progress=lambda line: print(line, flush=True))
    print(format_frontier(result))
    if args.json:
        print(f"\nwrote {result.write_json(args.json)}")
    if args.report:
        from ..report.frontier import write

        print(f"wrote {write(args.report, result.to_dict())}")
    return 0


def add(sub: argparse._SubParsersAction) -> None:
    from ..predict import gpus

    p = sub.add_parser("fit", help="the largest value of a script's integer argument (e.g. the batch size) that "
                       "fits a card, per allocator policy, predicted without a GPU",
                       description="Bisection over predictions (amem predict) of the script with --ARG set to "
                       "each value tried; assumes more of the argument never needs less memory.")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--gpu", help=f"the card to fit (default {gpus.DEFAULT}; see amem predict --help)")
    where.add_argument("--capacity-gb", type=float, help="instead of --gpu: usable device memory in GiB")
    p.add_argument("--arg", required=True, help="the script's argument to search, without dashes (set as "
                   "--ARG V or --ARG=V where the command line has it, added as --ARG=V where not)")
    p.add_argument("--lo", type=int, default=1, help="the smallest value (default 1)")
    p.add_argument("--hi", type=int, help="the largest value to try (default: doubling from --lo until it "
                   "does not fit)")
    p.add_argument("--policy", help="comma-separated policy names or 'all'; default: "
                   + ",".join(policies_mod.DEFAULT_COMPARE))
    p.add_argument("--steps", type=int, help="optimizer steps per trial, as amem predict's (default 5)")
    p.add_argument("--timeout", type=float, help="seconds per trial, as amem predict's (default 600)")
    p.add_argument("--across", metavar="NAME=V1,V2,...", help="a second argument and its values: the largest "
                   "--ARG at each of them, per policy (the frontier of what fits, e.g. batch size x context)")
    p.add_argument("--json", help="write the answer as JSON")
    p.add_argument("--report", help="with --across: write the frontier's page (a table and a plot)")
    p.add_argument("target", nargs=argparse.REMAINDER, help="-- python script.py args...")
    p.error = _fail  # type: ignore[method-assign]  - one line, no usage dump
    p.set_defaults(func=fit_command)  # bad input, or no answer (FitError, a ValueError): exit 2 in cli/main.py
