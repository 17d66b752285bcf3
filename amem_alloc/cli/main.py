"""The `amem` command (also `python -m amem_alloc`): one module per command in this package.

    amem run script.py args...     run a script with amem as torch's CUDA allocator
    amem run -m module args...     the same for a module
    amem demo [--backend sim]      replay a realistic training pattern; print stats and fragmentation
    amem config                    the options table and the configuration in effect
    amem doctor                    what is installed; whether the start-up hook, torch, a GPU and VMM are usable
    amem report TRACE -o report.html   an offline HTML report of a snapshot (amem's or torch's)
    amem export TRACE -f chrome|rmm -o OUT   Chrome/Perfetto JSON, or RMM's replay CSV
    amem replay TRACE --policy torch,amem   replay a trace under allocator policies (sim backend)
    amem compare --workload gpt             every policy on a workload, one process each (predicted without a GPU)
    amem predict --gpu H100-80GB -- python train.py   GPU memory per policy, predicted without a GPU
    amem fit --gpu H100-80GB --arg batch_size -- python train.py   the largest batch that fits, per policy

Exit status, the same for every command:
    0    done
    1    amem's own error, said in one line (a bad value found after parsing, a file it cannot
         read or write); amem predict says bad input with 2 (EXIT_BAD_INPUT), its 3, 4 and 124
         are in cli/predict.py
    2    a mistake in the command line itself (argparse, one line: cli/parser.py)
    130  Ctrl-C
    the script's own status, under run, compare and predict: its traceback is printed as Python
         prints it, from its own frames (user_script.py, the one script runner)

One flag name per concept across commands: --policy for the allocator policies (--policies, the
old spelling in compare, stays an alias); --device, --json, --out/-o, --steps, --size alike.
"""
from __future__ import annotations

import argparse
import sys

from . import compare, config, demo, doctor, export, fit, parser, predict, replay, report, run

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
COMMANDS = (run, demo, config, doctor, report, export, replay, compare)  # predict and fit register with add_command


def _parser() -> argparse.ArgumentParser:
    top = parser.Parser(prog="amem", description="amem_alloc: a CUDA caching allocator for PyTorch")
    sub = top.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add(sub)
    predict.add_command(sub)
    fit.add_command(sub)
    return top


def main(argv: list[str] | None = None) -> int:
    """Runs one command; amem's own errors become one line and exit status 1 (Ctrl-C: 130).

    A script's errors under `amem run` never get here: user_script prints them as Python does.
    """
    args = _parser().parse_args(argv)
    command = f"amem {args.command}"
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"{command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (ValueError, RuntimeError, MemoryError, OSError) as err:
        print(parser.one_line(err, command), file=sys.stderr)
        return EXIT_ERROR
