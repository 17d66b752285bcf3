"""`amem fit`: the largest value of a script's integer argument with which the run fits a card,
per allocator policy, by bisection over predictions (fit.py).

    amem fit --gpu NAME --arg NAME [--across NAME=V1,V2,...] [--lo N] [--hi N] [--margin 5%|GiB]
             [--policy LIST] [--steps N] [--timeout S] [--json PATH] [--report PATH] [--debug]
             -- python SCRIPT ARGS...

The answer leaves --margin of the usable memory free (default 5%, stated in the output); the text
ends with it, one line per policy.

Exit status (cli/main.py's convention): 0 with an answer; 2 for bad arguments, and when there is no answer to find (the run
fails or does not fit at --lo, or its memory does not grow with the argument): one line each; 4 when amem itself
failed inside the run at --lo (its line says "cannot model ...; please report it"; --debug adds the traceback, as
for each trial that amem failed in).
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
    from . import predict_options

    if args.across:
        return _frontier(args, script, fit_mod)
    try:
        result = fit_mod.fit(script, args.arg, gpu=predict_options.card(args), policies=args.policy,
                             lo=args.lo, hi=args.hi, steps=args.steps, timeout=args.timeout, margin=args.margin,
                             progress=lambda line: print(line, flush=True), debug=args.debug)
    except fit_mod.FitError as err:
        if not err.amems:
            raise   # no answer to find: bad input (cli/main.py)
        print(f"amem fit: {err}", file=sys.stderr)
        return exit_status.NOT_MODELLED
    from ..report.prediction_text import format_fit

    written = [result.write_json(args.json)] if args.json else []
    print(format_fit(result, written=written))  # its last lines: the answer per policy
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

    from . import predict_options

    across, values = _across(args.across)
    result = fit_mod.frontier(script, args.arg, across, values, gpu=predict_options.card(args),
                              policies=args.policy, lo=args.lo, hi=args.hi, steps=args.steps,
                              timeout=args.timeout, margin=args.margin, debug=args.debug,
                              progress=lambda line: print(line, flush=True))
    print(format_frontier(result))
    if args.json:
        print(f"\nwrote {result.write_json(args.json)}")
    if args.report:
        from ..report.frontier import write

        print(f"wrote {write(args.report, result.to_dict())}")
    return 0


def add(sub: argparse._SubParsersAction) -> None:
    from ..predict import fit as fit_mod
    from ..predict import gpus
    from . import predict_options

    p = sub.add_parser("fit", help="the largest value of a script's integer argument (e.g. the batch size) that "
                       "fits a card, per allocator policy, predicted without a GPU",
                       description="Bisection over predictions (amem predict) of the script with --ARG set to "
                       "each value tried; assumes more of the argument never needs less memory.")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--gpu", help=f"the card to fit (default {gpus.DEFAULT}; see amem predict --help)")
    where.add_argument("--capacity-gb", type=float, help="instead of --gpu: usable device memory in GiB")
    predict_options.add_context_arguments(p)
    p.add_argument("--arg", required=True, help="the script's argument to search, without dashes (set as "
                   "--ARG V or --ARG=V where the command line has it, added as --ARG=V where not)")
    p.add_argument("--lo", type=int, default=1, help="the smallest value (default 1)")
    p.add_argument("--hi", type=int, help="the largest value to try (default: doubling from --lo until it "
                   "does not fit)")
    p.add_argument("--policy", help="comma-separated policy names or 'all'; default: "
                   + ",".join(policies_mod.DEFAULT_COMPARE))
    p.add_argument("--steps", type=int, help="optimizer steps per trial, as amem predict's (default 5)")
    p.add_argument("--timeout", type=float, help="seconds per trial, as amem predict's (default 600)")
    p.add_argument("--margin", default=fit_mod.DEFAULT_MARGIN,
                   help="usable memory every answer leaves free: a share (5%%) or GiB (1.5); default "
                   f"{fit_mod.DEFAULT_MARGIN.replace('%', '%%')} (the context is an estimate; 0 finds the very edge)")
    p.add_argument("--across", metavar="NAME=V1,V2,...", help="a second argument and its values: the largest "
                   "--ARG at each of them, per policy (the frontier of what fits, e.g. batch size x context)")
    p.add_argument("--json", help="write the answer as JSON")
    p.add_argument("--report", help="with --across: write the frontier's page (a table and a plot)")
    p.add_argument("--debug", action="store_true", help="when amem itself fails inside a trial, also print the "
                   "traceback, amem's frames included (for a report)")
    p.add_argument("target", nargs=argparse.REMAINDER, help="-- python script.py args...")
    p.error = _fail  # type: ignore[method-assign]  - one line, no usage dump
    p.set_defaults(func=fit_command)  # bad input, or no answer (FitError, a ValueError): exit 2 in cli/main.py
