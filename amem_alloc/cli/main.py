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

Exit status, the same for every command (the names are cli/exit_status.py's):
    0    done
    1    amem could not do it for a reason other than the input: torch has no pluggable allocator,
         a device call failed, a run under amem compare failed
    2    bad input, said in one line: a mistake in the command line (argparse's convention,
         cli/parser.py), a bad value or configuration (AMEM_CONF, AMEM_POLICY), a file that is
         missing, unreadable or not what the option asks for (user_input.UsageError,
         snapshot.SnapshotError: every ValueError); under amem fit also no answer to find
    3    amem predict --strict: the code needs a tensor's value (one line naming the file and line)
    4    amem predict: the run cannot be predicted (one line naming amem's limit), or amem itself
         failed inside the script ("cannot model ...; please report it"; --debug: its traceback)
    124  amem predict: past --timeout
    130  Ctrl-C, at any moment (start-up too: the console script is amem_command.py, outside the
         package), one line: `amem COMMAND: interrupted`; also a KeyboardInterrupt the script raises
         under predict, compare and fit
    143  amem compare or predict ended by SIGTERM (`amem COMMAND: terminated`; compare's children
         ended first, predict's scratch folders removed)
    the script's own status, under run, compare and predict: its traceback is printed as Python
         prints it, from its own frames (user_script.py, the one script runner)

One flag name per concept across commands: --policy for the allocator policies (--policies, the
old spelling in compare, stays an alias); --device, --json, --out/-o, --steps, --size alike.
"""
from __future__ import annotations

import argparse
import sys

from . import compare, config, demo, doctor, exit_status, export, fit, parser, predict, replay, report, run

COMMANDS = (run, demo, config, doctor, report, export, replay, compare, predict, fit)


def _parser() -> argparse.ArgumentParser:
    top = parser.Parser(prog="amem", description="amem_alloc: a CUDA caching allocator for PyTorch")
    sub = top.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add(sub)
    return top


def main(argv: list[str] | None = None) -> int:
    """Runs one command; amem's own errors become one line: bad input exits 2, any other 1, Ctrl-C 130.

    A script's errors under `amem run` never get here: user_script prints them as Python does.
    """
    command = "amem"
    try:
        args = parser.parse_command(_parser(), argv)
        command = f"amem {args.command}"
        return args.func(args)
    except KeyboardInterrupt:  # the same line wherever it lands: parsing, importing torch, a run
        print(f"{command}: interrupted", file=sys.stderr)
        return exit_status.INTERRUPTED
    except ValueError as err:  # UsageError, SnapshotError, a bad value or configuration
        print(parser.one_line(err, command), file=sys.stderr)
        return exit_status.BAD_INPUT
    except (RuntimeError, MemoryError, OSError) as err:
        print(parser.one_line(err, command), file=sys.stderr)
        return exit_status.FAILED
    except BaseException as stopped:
        if type(stopped).__name__ != "Terminated":   # SIGTERM under predict (predict/stop_signals.py)
            raise
        print(f"{command}: terminated", file=sys.stderr)
        return exit_status.TERMINATED
