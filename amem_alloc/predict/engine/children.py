"""Child processes under prediction: what runs there is real CPU work; CUDA there is not modelled.

Design note
-----------
A prediction models one process. Children are common and mostly harmless: DataLoader workers
(fork or spawn) only load and collate data on the CPU, which is real under prediction. A child
that touches CUDA is another matter: its memory is not in the prediction, and on a machine with
no GPU it would die with "Found no NVIDIA driver" while the parent printed a prediction as if
nothing had happened.

So while a prediction runs (`ChildWatch`):
* a forked child (os.fork, multiprocessing's fork) inherits the session; its first CUDA
  allocation raises NotModelledError there;
* a child started by multiprocessing with spawn or forkserver runs its target inside
  `_GuardedTarget`, which makes CUDA's first touch (torch.cuda's lazy init) raise it there;
* either way the child writes one report into a folder the parent made and exits non-zero; the parent reads the reports when the run ends and the
  prediction prints one line per child naming amem's limit and exits with status 4, instead of
  printing figures.
"""
from __future__ import annotations

import json
import multiprocessing.process
import os
import shutil
import sys

from ...patching import PatchSet, declare
from .. import scratch
from ..notes import NotModelledError, call_site

ENV = "AMEM_PREDICT_CHILD_REPORTS"
CHILD_FOLDER = declare("os.environ", ENV, "children of a predicted script write what they did with CUDA there")
PROCESS_START = declare("multiprocessing.process.BaseProcess", "start",
                        "a child's target is guarded: its first use of CUDA stops it with one line")
CHILD_LAZY_INIT = declare("torch.cuda (in a spawned child)", "_lazy_init", "CUDA's first touch stops the child")
CHILD_AVAILABLE = declare("torch.cuda (in a spawned child)", "is_available", "the child's code takes its CUDA path")
EXIT_CHILD = 86   # a child's exit status when it stopped at CUDA (any non-zero would do)
_forked_from: list[int] = []   # the parent's pid, in a child forked during a prediction


def _after_fork_in_child() -> None:
    if os.environ.get(ENV):
        _forked_from[:] = [os.getppid()]


os.register_at_fork(after_in_child=_after_fork_in_child)


def in_child() -> bool:
    """Whether this process is a child forked while a prediction ran."""
    return bool(_forked_from) and bool(os.environ.get(ENV))


def report(what: str, where: str) -> str:
    """Writes this child's report for the parent; returns the line to print."""
    line = (f"amem predict: a child process (pid {os.getpid()}) used CUDA at {where}: {what}; prediction "
            "models one process, so this run cannot be predicted")
    folder = os.environ.get(ENV)
    if folder and os.path.isdir(folder):
        with open(os.path.join(folder, f"{os.getpid()}.json"), "w") as f:
            json.dump({"pid": os.getpid(), "what": what, "where": where, "line": line}, f)
    return line


def cuda_in_child() -> NotModelledError:
    """The error for a CUDA allocation in a forked child (its report written)."""
    err = NotModelledError("CUDA memory allocated in a child process", call_site(2))
    err.line = report(err.what, err.where)
    return err


class _GuardedTarget:
    """A multiprocessing target that stops, with one line, at its first use of CUDA."""

    def __init__(self, target):
        self.target = target

    def __call__(self, *args, **kwargs):
        if not in_child():
            _guard_cuda()
        try:
            return self.target(*args, **kwargs)
        except NotModelledError as err:   # the parent prints the report's line
            if not getattr(err, "line", None):
                report(err.what, err.where)
            sys.exit(EXIT_CHILD)


def _guard_cuda() -> None:
    """In a spawned child (no session there): CUDA's first touch raises NotModelledError. The child
    keeps these patches for its life (its PatchSet is never closed: the process ends with them)."""
    import torch.cuda

    def lazy_init():
        # reported here: the target may catch it (torch.multiprocessing's `_wrap` sends its own
        # traceback to the parent and exits 1), and the parent must still name amem's limit
        err = NotModelledError("CUDA used in a spawned child process", call_site(2))
        err.line = report(err.what, err.where)
        raise err

    patches = PatchSet()
    patches.apply(CHILD_LAZY_INIT, torch.cuda, "_lazy_init", lazy_init)
    patches.apply(CHILD_AVAILABLE, torch.cuda, "is_available", lambda: True)


class ChildWatch:
    """While active: children are guarded; `reports()` lists what children said."""

    def __init__(self) -> None:
        self.folder: str | None = None
        self.patches = PatchSet()

    def __enter__(self) -> "ChildWatch":
        self.folder = scratch.make("children")
        self.patches.setenv(CHILD_FOLDER, ENV, self.folder)
        original = multiprocessing.process.BaseProcess.start

        def start(process):
            if getattr(process, "_target", None) is not None and not isinstance(process._target, _GuardedTarget):
                process._target = _GuardedTarget(process._target)
            return original(process)

        self.patches.apply(PROCESS_START, multiprocessing.process.BaseProcess, "start", start)
        return self

    def reports(self) -> list[dict]:
        if not self.folder or not os.path.isdir(self.folder):
            return []
        out = []
        for name in sorted(os.listdir(self.folder)):
            try:
                with open(os.path.join(self.folder, name)) as f:
                    out.append(json.load(f))
            except (OSError, ValueError):
                continue
        return out

    def __exit__(self, *exc) -> None:
        self.patches.close()
        self.patches = PatchSet()

    def cleanup(self) -> None:
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)
