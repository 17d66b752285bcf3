"""Checking what a user typed on the `amem` command line, before any work starts.

Design note
-----------
A user's mistake (a bad number, a path that cannot be written, a file that is not what the
option asks for) is reported in one line that says what was wrong and what to do, with a
non-zero exit status and no Python traceback; amem_alloc/cli.py prints it. The checks here run
before the command does any work, so a long replay never ends in an unwritable output path.

UsageError is such a mistake. `one_line(err)` is the line for any error amem reports itself
(never doubled "amem: amem:"; an OSError as "path: reason"); sizes in messages go through
introspection.format_bytes.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

PROVENANCE_FORMAT = "amem_alloc.provenance/"


class UsageError(ValueError):
    """A user mistake: the message says what was wrong and what to do."""


class Parser(argparse.ArgumentParser):
    """argparse, but a mistake is one line (`amem replay: --top: ...; see amem replay --help`), exit 2."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def one_line(err: BaseException, command: str = "amem") -> str:
    """The single line amem prints for one of its own errors."""
    if isinstance(err, OSError) and err.filename is not None:
        text = f"{err.filename}: {err.strerror or err}"
    else:
        text = str(err).strip() or type(err).__name__
    text = " ".join(text.split("\n")[0].split()) if "\n" in text else text
    return text if text.startswith("amem") else f"{command}: {text}"


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


def require_module(module: str, option: str, package: str | None = None) -> None:
    """An optional dependency an option needs: one line saying what to install when it is missing."""
    import importlib.util

    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise UsageError(f"{option} needs {module}, which is not installed; install it with "
                         f"`python -m pip install {package or module}`, or leave {option} out")


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
    from .snapshot import MAX_FILE_BYTES

    parser.add_argument("--max-trace-mb", type=trace_limit_mb, default=MAX_FILE_BYTES >> 20,
                        help=f"refuse trace files larger than this many MiB (default {MAX_FILE_BYTES >> 20}; "
                             "loading takes about 10-20 times the file's size in memory)")


def apply_trace_limit(args: argparse.Namespace) -> None:
    from .snapshot import set_max_trace_bytes

    set_max_trace_bytes(args.max_trace_mb << 20)


def whole_gb(text: str) -> int:
    value = capacity_gb(text)
    if value != int(value):
        raise argparse.ArgumentTypeError(f"{text} is not a whole number of GiB")
    return int(value)


# ---------------------------------------------------------------------------- files
def output_file(path: Any, option: str = "-o") -> Path:
    """A file amem is about to write: its folder must exist and be a folder; it must not be a folder."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise UsageError(f"{option} {path}: is a folder; give a file name inside it")
    if not parent.exists():
        raise UsageError(f"{option} {path}: the folder {parent} does not exist; create it first or write elsewhere")
    if not parent.is_dir():
        raise UsageError(f"{option} {path}: {parent} is not a folder; write elsewhere")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"{option} {path}: the folder {parent} is not writable; write elsewhere")
    return path


def output_folder(path: Any, option: str = "--out") -> Path:
    """A folder amem will create (with its parents) and write into."""
    path = Path(path)
    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                raise UsageError(f"{option} {path}: {p} is a file, not a folder; write elsewhere")
            if not os.access(p, os.W_OK) and p != path:
                raise UsageError(f"{option} {path}: the folder {p} is not writable; write elsewhere")
            break
    return path


def input_file(path: Any, what: str) -> Path:
    """A file amem is about to read (`-`: standard input, read by the loader itself)."""
    if str(path) == "-":
        return Path("-")
    path = Path(path)
    if not path.exists():
        raise UsageError(f"{path}: no such file; give the path of {what}")
    if path.is_dir():
        raise UsageError(f"{path}: is a folder; give the path of {what}")
    if not path.is_file():  # a device or a pipe: reading it may never end, or wait for a writer for ever
        raise UsageError(f"{path}: not a regular file (a device or a pipe); give the path of {what}, "
                         "or - for standard input")
    return path


def provenance_file(path: Any) -> dict:
    """The JSON Tracer.to_json() wrote, checked for the keys the report reads."""
    input_file(path, "a provenance JSON file (Tracer.to_json(path))")
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise UsageError(f"{path}: cannot read it: {err.strerror or err}") from None
    except ValueError as err:
        raise UsageError(f"{path}: not valid JSON ({err}); --provenance takes the file Tracer.to_json(path) "
                         "writes") from None
    problem = provenance_problem(data)
    if problem:
        raise UsageError(f"{path}: not a provenance file: {problem}; --provenance takes the file "
                         "Tracer.to_json(path) writes")
    return data


_STEP_KEYS = {"step": int, "steps": int, "status": str, "message": str, "accounting": list, "total": dict,
              "modules": list, "saved": list}


def provenance_problem(data: Any) -> str | None:
    """Why `data` is not Tracer.to_dict()'s shape, or None."""
    if not isinstance(data, dict):
        return f"the top level is a JSON {type(data).__name__}, not an object"
    fmt = data.get("format")
    if not isinstance(fmt, str) or not fmt.startswith(PROVENANCE_FORMAT):
        return f"its \"format\" is {fmt!r}, not \"{PROVENANCE_FORMAT}1\""
    steps = data.get("activations")
    if not isinstance(steps, list):
        return "no \"activations\" list"
    for i, step in enumerate(steps):
        if not isinstance(step, dict):
            return f"activations[{i}] is not an object"
        for key, kind in _STEP_KEYS.items():
            if not isinstance(step.get(key), kind):
                return f"activations[{i}].{key} is missing or not a {kind.__name__}"
    return None
