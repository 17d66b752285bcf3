"""Running the user's own script (`amem run`, `amem compare -- python script.py`) as Python would.

Design note
-----------
The script's errors are the script's: an exception it raises (a torch.OutOfMemoryError
included) is printed as Python prints it — the full traceback, from the script's first frame
on (amem's and runpy's frames above it are left out) — and the exit status is Python's: 1 for
an exception, the code of sys.exit(), 130 for Ctrl-C. amem never turns them into "amem: ..."
lines. Only problems amem finds before the script starts (no such file or module) are amem's.

A script that ends its process with `os._exit(status)` (to skip its libraries' teardown) ends as
`sys.exit(status)` would, so what amem writes after it (the prediction, the trace) is still
written: while the script runs, `os._exit` called by its main thread in this process raises
ScriptExit. Elsewhere (a forked child, which multiprocessing ends with os._exit; another thread)
it is Python's. Unlike the real call, the script's own `finally` blocks run on the way out.

Under prediction, amem's own code runs inside the script (fake CUDA tensors), and an exception can
be amem's although it ends the script: `run(..., amems=...)` lets the caller take those out
(predict/failures.py decides which). An exception amem raises on purpose for the script to see,
as torch would raise it for the same call (an invalid device id, no SDPA kernel for the inputs),
or as amem's own API refuses a call, is marked `for_the_script(err)`: it is the script's.
"""
from __future__ import annotations

import builtins
import contextlib
import importlib.machinery
import importlib.util
import os
import re
import runpy
import sys
import threading
import traceback
from pathlib import Path
from typing import Callable, Iterator

from .patching import PatchSet, declare
from .user_input import UsageError

PROCESS_EXIT = declare("os", "_exit", "while the user's script runs: called by its main thread, it ends the script "
                       "as sys.exit would, so the prediction or trace is still written")
RUN_PATH = declare("runpy", "run_path", "while the user's script runs: a file it runs as a script (torchtune's "
                   "`tune run` runs its recipe so) is the program's own code in notes and call sites")
RUN_MODULE = declare("runpy", "run_module", "while the user's script runs: a module it runs as a script is the "
                     "program's own code in notes and call sites")

_RUNPY = os.path.dirname(runpy.__file__)
_RUN_PATH, _RUN_MODULE = runpy.run_path, runpy.run_module   # the script runner's own, never the wrapped ones
_MISSING = object()
_ENTRY_IMPORT = re.compile(r"^from ([A-Za-z_][\w.]*) import \w+", re.M)   # pip's console-script template
_AMEM = os.path.dirname(os.path.abspath(__file__))


class ScriptExit(SystemExit):
    """The script called os._exit(status): it ends as sys.exit(status) would."""


@contextlib.contextmanager
def _os_exit_ends_the_script() -> Iterator[None]:
    """os._exit from the script's main thread in this process raises ScriptExit (see the note above)."""
    real, pid, main = os._exit, os.getpid(), threading.main_thread()

    def _exit(status: int) -> None:
        if os.getpid() != pid or threading.current_thread() is not main:
            real(status)
        raise ScriptExit(status)
    with PatchSet() as patches:
        patches.apply(PROCESS_EXIT, os, "_exit", _exit)
        yield


@contextlib.contextmanager
def _what_the_script_runs_is_the_program() -> Iterator[None]:
    """A file or module the script runs as a script itself (`tune run` runs its recipe with
    runpy.run_path) counts as the program's own code, as the script does: notes name the recipe's
    line, not torchtune's config wrapper around it."""
    def path(path_name, *args, **kwargs):
        from . import code_files
        code_files.run_as_program(os.path.dirname(os.path.abspath(os.fspath(path_name))))
        return _RUN_PATH(path_name, *args, **kwargs)

    def module(mod_name, *args, **kwargs):
        _count_package_as_program(mod_name)
        return _RUN_MODULE(mod_name, *args, **kwargs)
    with PatchSet() as patches:
        patches.apply(RUN_PATH, runpy, "run_path", path)
        patches.apply(RUN_MODULE, runpy, "run_module", module)
        yield


class ScriptFailed(Exception):
    """The user's script ended with a non-zero exit status (its traceback already printed)."""

    def __init__(self, script: str, status: int, error: str | None = None) -> None:
        super().__init__(f"{script} exited with status {status}")
        self.script, self.status = script, status
        self.error = error   # "train.py:12: ValueError: ..." where it raised (error_line), else None


_FOR_THE_SCRIPT = "_amem_for_the_script"


def for_the_script(err: BaseException) -> BaseException:
    """Marks an exception that amem raises on purpose for the script to see (see the note): the
    script's error, whichever frame raised it. Returns it, for `raise for_the_script(...)`."""
    setattr(err, _FOR_THE_SCRIPT, True)
    return err


def is_for_the_script(err: BaseException) -> bool:
    return bool(getattr(err, _FOR_THE_SCRIPT, False))


MODULE = "-m"   # a command kept as argv: [script, args...] or [MODULE, module, args...]


def target_of(argv: list[str]) -> tuple[str, list[str], bool]:
    """(script or module, its arguments, whether it is a module) of a command's argv."""
    if argv and argv[0] == MODULE:
        return argv[1], argv[2:], True
    return argv[0], argv[1:], False


def name_of(argv: list[str]) -> str:
    """How the output names the command: the script's path, or `-m module`."""
    target, _, module = target_of(argv)
    return f"-m {target}" if module else target


def check_target(target: str, module: bool) -> None:
    """UsageError if the script or module does not exist (amem's to say, before anything runs)."""
    if module:
        if not _module_exists(target):
            raise UsageError(f"no module named {target!r}; check the name, or give a script path instead of -m")
    elif not Path(target).is_file():
        what = "is a folder" if Path(target).is_dir() else "no such file"
        raise UsageError(f"{target}: {what}; give the path of a Python script (amem run train.py args...)")


def _module_exists(target: str) -> bool:
    """Whether `python -m target` run here finds the module: the working folder first on the path,
    as python -m puts it, and no package's __init__ run to find out (the program's code runs under
    prediction, not before it)."""
    parts = target.split(".")
    path_before = list(sys.path)
    sys.path.insert(0, os.getcwd())
    try:
        spec = importlib.util.find_spec(parts[0])   # a top-level name: found, not imported
        for depth in range(2, len(parts) + 1):
            locations = spec.submodule_search_locations if spec is not None else None
            if locations is None:
                return False
            spec = importlib.machinery.PathFinder.find_spec(".".join(parts[:depth]), list(locations))
    except (ImportError, ValueError):
        return False
    finally:
        sys.path[:] = path_before
    return spec is not None


def _user_frames(tb):
    """The traceback from the first frame that is neither amem's run machinery nor runpy's."""
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if name != __file__ and not name.startswith(_RUNPY) and "<frozen runpy>" not in name:
            return tb
        tb = tb.tb_next
    return None


def script_traceback(err: BaseException) -> str:
    """The traceback of `err` from the script's first frame on, every frame after it included
    (amem's too: what `amem predict --debug` shows of amem's own failure)."""
    return "".join(traceback.format_exception(type(err), err, _user_frames(err.__traceback__)))


def error_line(err: BaseException) -> str:
    """`err` in one line, where the script's own code raised it: "train.py:12: ValueError: bad
    value" (the last frame outside amem, torch and the other libraries; its first message line)."""
    from . import code_files   # (imports torch: called where a prediction ran the script)

    frames = traceback.extract_tb(_user_frames(err.__traceback__))
    mine = [f for f in frames if code_files.is_user_file(f.filename)]
    where = f"{code_files.display_path(mine[-1].filename, os.getcwd())}:{mine[-1].lineno}: " if mine else ""
    message = (str(err).strip().splitlines() or [""])[0]
    return where + type(err).__name__ + (f": {message}" if message else "")


def print_script_error(err: BaseException) -> None:
    """The traceback Python would print, from the script's first frame on. Ctrl-C lands wherever
    the script was, often inside amem's own hooks, and an error amem raises as torch would (no SDPA
    kernel for these inputs) is raised inside its rules: those frames are left out of their
    tracebacks, which end where the script's or a library's code called torch."""
    tb = _user_frames(err.__traceback__)
    if not isinstance(err, KeyboardInterrupt) and not is_for_the_script(err):
        traceback.print_exception(type(err), err, tb)
        return
    shown = traceback.TracebackException(type(err), err, tb)
    shown.stack = traceback.StackSummary.from_list([f for f in shown.stack if not f.filename.startswith(_AMEM)])
    print("".join(shown.format()), end="", file=sys.stderr)


def cuda_start_failed(err: BaseException) -> str | None:
    """'train.py:2: Found no NVIDIA driver ...' when `err` is torch failing to start CUDA (raised by
    torch.cuda's lazy initialisation: no driver, no device, a CPU-only build), else None."""
    frames = traceback.extract_tb(err.__traceback__)
    if not frames or frames[-1].name != "_lazy_init" or not frames[-1].filename.endswith(
            os.path.join("torch", "cuda", "__init__.py")):
        return None
    mine = [f for f in frames if not f.filename.startswith((_AMEM, _RUNPY)) and os.sep + "torch" + os.sep not in f.filename]
    where = f"{mine[-1].filename}:{mine[-1].lineno}: " if mine else ""
    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return where + first.split(". ")[0]  # torch's first sentence: "Found no NVIDIA driver on your system"


def exit_status(code) -> int:
    """What Python's exit status would be for SystemExit(code)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF  # what the shell sees: sys.exit(-1) is 255, as under python itself
    print(code, file=sys.stderr)  # sys.exit("message"): Python prints it and exits 1
    return 1


def run(target: str, args: list[str], module: bool = False, reraise: tuple = (),
        explain: Callable[[BaseException], str | None] | None = None,
        amems: Callable[[BaseException], BaseException | None] | None = None,
        failed_with: list[str] | None = None) -> int:
    """Runs the script or module as __main__; returns its exit status (its traceback printed).

    Exceptions of the `reraise` types propagate instead (amem compare's GPU runs count a
    torch.OutOfMemoryError as the run's OOM); so does an exception for which `amems(err)` returns
    an exception (amem's own failure, predict/failures.py), that one, raised from err. Where
    `explain(err)` gives a line (amem run: the script's first CUDA call on a machine with no GPU),
    that line is printed instead of the traceback. The script's own exception, if it raised one, is
    appended to `failed_with` in one line (error_line). The caller's sys.argv, sys.path, sys.stdout and
    sys.stderr and the builtins are theirs again afterwards: an in-process prediction (amem_alloc.fit,
    a rank) leaves no script folder behind, and what amem prints after the script is not swallowed by
    a `print` the script replaced (torchvision's references silence it on every rank but 0) or sent to
    a log file it made the standard output.
    """
    argv_before, path_before, streams = sys.argv, list(sys.path), (sys.stdout, sys.stderr)
    builtins_before = dict(vars(builtins))
    sys.argv = [target, *args]
    try:
        with _os_exit_ends_the_script(), _what_the_script_runs_is_the_program():
            return _run_as_main(target, module, reraise, explain, amems, failed_with)
    finally:
        sys.argv = argv_before
        sys.path[:] = path_before
        sys.stdout, sys.stderr = streams
        _put_back(vars(builtins), builtins_before)


def _run_as_main(target: str, module: bool, reraise: tuple, explain,
                 amems: Callable[[BaseException], BaseException | None] | None,
                 failed_with: list[str] | None = None) -> int:
    try:
        if module:
            sys.path.insert(0, os.getcwd())   # as `python -m` puts the working folder first
            _count_package_as_program(target)
            _RUN_MODULE(target, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, str(Path(target).resolve().parent))
            entry = console_script_entry(target)
            if entry is not None:   # a command pip installed: its package is the program's code
                _count_package_as_program(entry)
            _RUN_PATH(target, run_name="__main__")
    except SystemExit as done:
        return exit_status(done.code)
    except reraise:
        raise
    except BaseException as err:  # noqa: BLE001 - the script's own error: shown as Python shows it
        amems_instead = amems(err) if amems is not None else None
        if amems_instead is not None:
            raise amems_instead from err
        if failed_with is not None:
            failed_with.append(error_line(err))
        line = explain(err) if explain is not None else None
        if line:
            print(line, file=sys.stderr)
            return 1
        print_script_error(err)
        return 130 if isinstance(err, KeyboardInterrupt) else 1
    return 0


def _put_back(table: dict, before: dict) -> None:
    """`table` as `before` was: what was added removed, what was replaced or removed put back."""
    for name in [n for n in table if n not in before]:
        del table[name]
    for name, value in before.items():
        if table.get(name, _MISSING) is not value:
            table[name] = value


def console_script_entry(path: str) -> str | None:
    """The module a command pip installed (`litgpt`, `tune`: a Python file without .py whose
    `from MODULE import main` calls the entry point) runs, or None for any other script."""
    if path.endswith(".py"):
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            head = f.read(2048)
    except OSError:
        return None
    found = _ENTRY_IMPORT.search(head)
    return found.group(1) if found and head.startswith("#!") else None


def _count_package_as_program(module: str) -> None:
    """The module's top-level package is the program's own code (its frames are the user's lines
    in notes and call sites), though it is installed like a library."""
    from . import code_files

    try:
        spec = importlib.util.find_spec(module.partition(".")[0])
    except (ImportError, ValueError):
        return
    for location in (spec.submodule_search_locations or []) if spec else []:
        code_files.run_as_program(location)
