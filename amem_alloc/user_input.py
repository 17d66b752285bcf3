"""Checking what a user gave amem (a path to write, a file to read) before any work starts.

Design note
-----------
A user's mistake (a bad number, a path that cannot be written, a file that is not what the
option asks for) is reported in one line that says what was wrong and what to do, with a
non-zero exit status and no Python traceback; amem_alloc/cli/main.py prints it. The checks here run
before the command does any work, so a long replay never ends in an unwritable output path.

UsageError is such a mistake. The command line's own checks (argparse types, one-line parser
errors) are amem_alloc/cli/parser.py's; these are also used by the Python API (Tracer.to_json's
path), so they live below the commands.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .provenance_format import provenance_problem


class UsageError(ValueError):
    """A user mistake: the message says what was wrong and what to do."""


def require_module(module: str, option: str, package: str | None = None, instead: str | None = None) -> None:
    """An optional dependency an option needs: one line saying what to install when it is missing
    (and what to do `instead`, where something needs no install; else: leave the option out)."""
    import importlib.util

    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise UsageError(f"{option} needs {module}, which is not installed; install it with "
                         f"`python -m pip install {package or module}`, or {instead or f'leave {option} out'}")


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
