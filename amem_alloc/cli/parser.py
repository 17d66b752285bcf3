"""The one parser helper of the `amem` commands: argparse with one-line mistakes, the number types
the options take, and the trace-size option that every command reading a trace shares.

A mistake argparse finds is one line (`amem replay: --top: ...; see amem replay --help`) and exit
status 2, as is a bad value the command finds later (cli/main.py has the exit-status convention).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import NoReturn

from .. import user_script
from ..near_names import did_you_mean

# What to install for an option that needs matplotlib (`--plot`, compare.png): the extra in pyproject.toml.
PLOTS_EXTRA = "'amem_alloc[plots]'"


class Parser(argparse.ArgumentParser):
    """argparse, but a mistake is one line (`amem replay: --top: ...; see amem replay --help`), exit 2,
    and a mistyped choice names the nearest one (`invalid choice: 'gtp' (did you mean gpt?)`)."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)

    def _check_value(self, action: argparse.Action, value: object) -> None:
        if action.choices is not None and value not in action.choices:
            choices = ", ".join(map(repr, action.choices))
            raise argparse.ArgumentError(action, f"invalid choice: {value!r}"
                                         f"{did_you_mean(str(value), map(str, action.choices))} "
                                         f"(choose from {choices})")
        super()._check_value(action, value)


def parse_command(top: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The top parser's arguments; an argument the command does not take is the command's mistake
    (`amem predict: unrecognized arguments: --gpus (did you mean --gpu?)`), not `amem`'s."""
    args, extra = top.parse_known_args(argv)
    if extra:
        command = _subparsers(top)[args.command]
        flags = [f for a in command._actions for f in a.option_strings]
        near = "".join(did_you_mean(e.split("=")[0], flags) for e in extra if e.startswith("-"))
        command.error("unrecognized arguments: " + " ".join(extra) + near)
    return args


def _subparsers(top: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a.choices for a in top._actions if isinstance(a, argparse._SubParsersAction))


def one_line(err: BaseException, command: str = "amem") -> str:
    """The single line amem prints for one of its own errors (every command's, and a prediction that
    stops: cli/predict_exits.py): its first line, prefixed with the command unless the message names
    amem already ("amem: ...", "amem predict: ...")."""
    if isinstance(err, OSError) and err.filename is not None:
        text = f"{err.filename}: {err.strerror or err}"
    else:
        text = str(err).strip() or type(err).__name__
    text = " ".join(text.split("\n")[0].split()) if "\n" in text else text
    return text if text.startswith(("amem:", "amem ")) else f"{command}: {text}"


# ---------------------------------------------------------------------------- numbers (argparse types)
def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; give an integer >= 1") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is too small; give an integer >= 1")
    return value


def int_up_to(most: int):
    """An argparse type: an integer from 1 to `most`."""
    def parse(text: str) -> int:
        value = positive_int(text)
        if value > most:
            raise argparse.ArgumentTypeError(f"{value} is too large; give an integer from 1 to {most:,}")
        return value

    parse.__name__ = f"integer up to {most}"
    return parse


def count_up_to(most: int):
    """An argparse type: an integer from 0 to `most` (0 where the option means "no limit")."""
    def parse(text: str) -> int:
        if text.strip() == "0":
            return 0
        return int_up_to(most)(text)

    parse.__name__ = f"integer from 0 to {most}"
    return parse


def capacity_gb(text: str) -> float:
    """A device capacity in GiB: a finite number >= 0 (0: unlimited)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; give the capacity in GiB, e.g. 80") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a capacity; give a finite number of GiB >= 0 "
                                         "(0 means unlimited)")
    if value * (1 << 30) >= 1 << 63:
        raise argparse.ArgumentTypeError(f"{text} GiB is more than amem can address; give at most "
                                         f"{(1 << 63) / (1 << 30):.0f} GiB")
    return value


def device_index(text: str) -> int:
    """--device: a device index, 0 .. 1023."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a device index; give an integer from 0") from None
    if not 0 <= value < 1024:
        raise argparse.ArgumentTypeError(f"{value} is not a device index; give an integer from 0 to 1023")
    return value


def trace_limit_mb(text: str) -> int:
    """--max-trace-mb: the largest trace file (or standard input) amem reads, in MiB."""
    value = positive_int(text)
    if value > 1 << 30:
        raise argparse.ArgumentTypeError(f"{value} MiB is more than amem can read; give at most {1 << 30}")
    return value


def add_trace_limit(parser: argparse.ArgumentParser) -> None:
    """The size cap of the traces a command reads (amem_alloc/snapshot/load.py)."""
    from ..snapshot import MAX_FILE_BYTES

    parser.add_argument("--max-trace-mb", type=trace_limit_mb, default=MAX_FILE_BYTES >> 20,
                        help=f"refuse trace files larger than this many MiB (default {MAX_FILE_BYTES >> 20}; "
                             "loading takes about 10-20 times the file's size in memory)")


def apply_trace_limit(args: argparse.Namespace) -> None:
    from ..snapshot import set_max_trace_bytes

    set_max_trace_bytes(args.max_trace_mb << 20)


def whole_gb(text: str) -> int:
    value = capacity_gb(text)
    if value != int(value):
        raise argparse.ArgumentTypeError(f"{text} is not a whole number of GiB")
    return int(value)


# ---------------------------------------------------------------------------- a script after --
PYTHONS = ("python", "python3")


def script_argv(target: list[str]) -> list[str] | None:
    """`-- python train.py args` -> ["train.py", "args"], `-- python -m pkg.mod args` -> ["-m",
    "pkg.mod", "args"] (it runs in amem's own interpreter, through user_script); None when nothing
    was given. ValueError for a file that is not a .py script."""
    target = target[1:] if target and target[0] == "--" else target
    if target and Path(target[0]).name.startswith(PYTHONS) and not target[0].endswith(".py"):
        target = target[1:]
    if target and target[0] == "-m":   # python -m module args: kept as user_script reads it
        if len(target) < 2:
            raise ValueError("-m: give the module to run (-- python -m package.module args...)")
        return [user_script.MODULE, *target[1:]]
    if target and not target[0].endswith(".py"):
        console = console_script(target[0])
        if console is None and _command_path(target[0]) is None:
            raise ValueError(f"{target[0]!r}: no such command (not on PATH nor beside this Python); give its "
                             "path, or -- python script.py args...")
        if console is None:
            raise ValueError(f"{target[0]!r} is not a Python script; use -- python script.py args...")
        target = [console, *target[1:]]
    return target or None


def console_script(name: str) -> str | None:
    """The path of a Python program without .py: a file, a command of amem's own environment or one
    on PATH, whose first line runs Python (`litgpt`, `tune`, `lightning` as pip installs them), else
    None."""
    path = _command_path(name)
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            first = f.readline(256)
    except OSError:
        return None
    words = first[2:].decode("utf-8", "replace").split() if first.startswith(b"#!") else []
    return path if any(Path(w).name.startswith(PYTHONS) for w in words[:2]) else None


def _command_path(name: str) -> str | None:
    """The file a command names: a path, or a command of amem's own environment or on PATH."""
    import shutil

    if os.sep in name:
        return name if Path(name).is_file() else None
    return shutil.which(name, path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))


def add_policy_option(p: argparse.ArgumentParser, default: str) -> None:
    """--policy (alias --policies): the one flag name for the allocator policies a command compares."""
    p.add_argument("--policy", "--policies", dest="policy", metavar="POLICIES",
                   help=f"comma-separated policy names, 'all', or conf:<AMEM_CONF> (last); default: {default}")


def existing_script(target: list[str]) -> list[str] | None:
    """`-- python train.py args` -> ["train.py", "args"] (script_argv), the script checked to exist."""
    argv = script_argv(target)
    if argv and argv[0] == user_script.MODULE:
        user_script.check_target(argv[1], module=True)
    elif argv and not Path(argv[0]).is_file():
        raise ValueError(f"{argv[0]}: no such script")
    return argv
