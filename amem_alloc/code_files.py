"""Which code a stack frame's file belongs to: the user's own, a library's (site-packages, torch),
the standard library's or amem's; a library file's short name (package/path.py); and a file as the
user reads it (display_path: the script's own relative to its folder, libraries by package).

Prediction notes name the user's line first and the library line below it; a predicted
allocation's frames are the user's and libraries' code up to amem's script runner; the prediction's
text, JSON, trace and report show files with display_path. All read these rules here, once.
"""
from __future__ import annotations

import os
import site
import sys
import sysconfig

import torch

_TORCH_DIR = os.path.dirname(torch.__file__)
_AMEM_DIR = os.path.dirname(os.path.abspath(__file__))
_STDLIB = (os.path.dirname(os.__file__),)
_SCRIPT_RUNNER = os.path.join(_AMEM_DIR, "user_script.py")


def _library_dirs() -> tuple[str, ...]:
    dirs = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *_installed_elsewhere()}
    try:
        dirs.update(site.getsitepackages())
        dirs.add(site.getusersitepackages())
    except AttributeError:   # a virtualenv's old site module
        pass
    return tuple(sorted(d for d in dirs if d))


def _installed_elsewhere() -> list[str]:
    """Folders on the import path, beside site-packages, that pip installed packages into
    (`pip install --target DIR`, then PYTHONPATH=DIR): they hold a package's `*.dist-info`. The
    current folder (the program's own) never counts."""
    here = {"", os.getcwd()}
    found = []
    for entry in sys.path:
        if entry in here or not os.path.isdir(entry):
            continue
        try:
            if any(name.endswith(".dist-info") for name in os.listdir(entry)):
                found.append(os.path.abspath(entry))
        except OSError:
            continue
    return found


_LIBRARIES = _library_dirs()
_NOT_USER = (_TORCH_DIR, _AMEM_DIR, *_STDLIB, *_LIBRARIES)
# torch's own plumbing between a call and the code that made it: never "the library line"
_PLUMBING = tuple(os.path.join(_TORCH_DIR, *p.split("/")) for p in (
    "_tensor.py", "overrides.py", "_ops.py", "utils/_python_dispatch.py", "utils/_contextlib.py",
    "utils/_device.py", "_compile.py", "nn/modules/module.py", "autograd/", "_dynamo/", "_jit_internal.py"))


_RUN_AS_PROGRAM: list[str] = []   # packages run as the program (`python -m pkg.train`): the user's code


def run_as_program(package_dir: str) -> None:
    """Counts the files under `package_dir` as the user's own code though installed as a package:
    the program is that package's module (torchrun -m torchtitan.train). A folder that is, or holds,
    a library folder (site-packages itself; a project whose virtual environment is inside it) is not
    one package: it never counts."""
    root = os.path.abspath(package_dir)
    if any(lib == root or lib.startswith(root + os.sep) for lib in (*_LIBRARIES, _TORCH_DIR, _AMEM_DIR)):
        return
    if root not in _RUN_AS_PROGRAM:
        _RUN_AS_PROGRAM.append(root)


def is_user_file(filename: str) -> bool:
    """Whether a frame's file is the user's own code (not torch, amem, the stdlib or a package,
    unless the program is that package's module)."""
    if _RUN_AS_PROGRAM and filename.startswith(tuple(r + os.sep for r in _RUN_AS_PROGRAM)):
        return True
    return not (filename.startswith(_NOT_USER) or filename.startswith("<"))


def short_path(filename: str) -> str:
    """A library file as package/path.py; a user file as given."""
    for root in (*_LIBRARIES, os.path.dirname(_TORCH_DIR)):
        if filename.startswith(root + os.sep):
            return filename[len(root) + 1:]
    return filename


def display_path(filename: str, base: str | None) -> str:
    """A frame's file as a reader wants it: relative to `base` (the script's folder) when inside it,
    a library file as package/path.py (site-packages dropped), anything else as it was."""
    if base and filename.startswith(base.rstrip(os.sep) + os.sep):
        return os.path.relpath(filename, base)
    return short_path(filename)


def is_traced_file(filename: str) -> bool:
    """Whether a frame's file shows among a predicted allocation's frames: the user's code and
    libraries', never torch's, amem's or the standard library's."""
    return not filename.startswith((_TORCH_DIR, _AMEM_DIR, *_STDLIB, "<frozen"))


def is_script_runner(filename: str) -> bool:
    """amem's script runner (user_script.py): the frames beyond it are amem's command line and the
    `amem` console script that started it, never the user's code."""
    return filename == _SCRIPT_RUNNER
