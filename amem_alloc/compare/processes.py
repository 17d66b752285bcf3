"""`amem compare`'s child processes: started, watched, and always ended.

Design note
-----------
Each configuration runs in a process of its own (runner.py), and the recording of a workload or a
script by prediction too. Whatever ends amem compare — done, an error, Ctrl-C (the terminal's
SIGINT reaches the whole foreground group), `kill` (SIGTERM reaches amem compare alone), `kill -9`
(which nothing sees) — no child outlives it:

* `Children` starts each child from the calling thread with its output in files (no pipe to fill
  up), polls them, and when its `with` block is left by an exception ends those still running
  (SIGTERM, then SIGKILL after a grace period) and waits for them;
* `sigterm_ends_the_run()` turns SIGTERM into SystemExit(143) (the shell's status for it) with one
  line, while the comparison runs, so those `with` blocks unwind: children ended, the work folder
  removed;
* `die_with_parent()`, called first thing in a child, asks Linux to kill the child when its parent
  dies (prctl PR_SET_PDEATHSIG), which covers `kill -9`;
* a child is started with SIGINT and SIGTERM held back (`_signals_deferred`) until it is on the
  list that `with` block ends: a signal that landed inside Popen, after the fork (on a loaded
  machine the child can be running for a while before Popen returns), used to leave a child nobody
  knew about, still running after amem compare had said "interrupted".

Polling is how the parent both waits and shows progress (a child writes its step count to a file,
runner.py reads it); POLL_S is the interval, not a deadline.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

POLL_S = 0.2                # how often the parent looks at its children
GRACE_S = 5.0               # SIGTERM to SIGKILL, when a child is ended
PARENT_ENV = "AMEM_COMPARE_PARENT"   # the parent's pid, so a child can tell it was orphaned before it asked
PR_SET_PDEATHSIG = 1        # linux/prctl.h
TERMINATED = 128 + signal.SIGTERM


@dataclass
class Finished:
    """A child's end: its exit status and what it wrote (stdout is None when it went to the terminal)."""
    returncode: int
    stdout: str | None
    stderr: str


@dataclass
class Job:
    """A child to run: `python -m module args...` in `env`, its stdout shown live or kept."""
    module: str
    args: list[str]
    env: dict
    live_stdout: bool = False


class _Running:
    def __init__(self, job: Job, folder: Path, n: int) -> None:
        self.out = None if job.live_stdout else open(folder / f"child-{n}.out", "w+")
        self.err = open(folder / f"child-{n}.err", "w+")
        self.proc = subprocess.Popen([sys.executable, "-m", job.module, *job.args], env=job.env,
                                     stdout=self.out, stderr=self.err, text=True)

    def finished(self) -> Finished:
        return Finished(self.proc.returncode, _read(self.out), _read(self.err) or "")

    def end(self) -> None:
        """SIGTERM, then SIGKILL if it has not stopped within GRACE_S."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(GRACE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.close()

    def close(self) -> None:
        for f in (self.out, self.err):
            if f is not None:
                f.close()


def _read(f) -> str | None:
    if f is None:
        return None
    f.flush()
    f.seek(0)
    return f.read()


class Children:
    """Runs jobs, at most `at_once` at a time; ends every child still running if left by an exception."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.running, self.started = folder, [], 0

    def __enter__(self) -> "Children":
        return self

    def __exit__(self, *exc) -> None:
        for child in self.running:
            child.end()
        self.running = []

    def run(self, jobs: list[Job], at_once: int, done: Callable[[int, Finished], None],
            tick: Callable[[], None] = lambda: None) -> None:
        """Runs every job; done(index, Finished) as each ends, tick() at every look."""
        waiting = list(enumerate(jobs))
        active: dict[int, _Running] = {}
        while waiting or active:
            while waiting and len(active) < max(1, at_once):
                i, job = waiting.pop(0)
                active[i] = self._start(job)
            for i, child in list(active.items()):
                if child.proc.poll() is not None:
                    del active[i]
                    self.running.remove(child)
                    result = child.finished()
                    child.close()
                    done(i, result)
            tick()
            if active:
                time.sleep(POLL_S)

    def _start(self, job: Job) -> _Running:
        with _signals_deferred():  # a Ctrl-C in Popen would lose the child it has just started
            child = _Running(job, self.folder, self.started)
            self.started += 1
            self.running.append(child)
        return child


@contextlib.contextmanager
def _handling(handlers: dict) -> Iterator[bool]:
    """While the block runs, each signal in `handlers` goes to its handler; the previous handlers
    are put back after. Only the main thread can set a handler: elsewhere the block runs with none
    set (it gets False)."""
    try:
        previous = {s: signal.signal(s, handler) for s, handler in handlers.items()}
    except ValueError:  # not the main thread
        yield False
        return
    try:
        yield True
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def _signals_deferred(signums: tuple = (signal.SIGINT, signal.SIGTERM)) -> Iterator[None]:
    """While the block runs, SIGINT and SIGTERM are noted instead of handled; after it, the handlers
    that were in place get them (KeyboardInterrupt, sigterm_ends_the_run's line). A child's own
    handlers are unchanged: exec resets a caught signal to its default. Off the main thread (no
    handler can be set there) the block just runs."""
    noted: list[int] = []
    try:
        with _handling({s: lambda signum, frame: noted.append(signum) for s in signums}):
            yield
    finally:
        for s in dict.fromkeys(noted):
            signal.raise_signal(s)


def child_env(env: dict) -> dict:
    """A child's environment: `env` and this process's pid, for die_with_parent()."""
    return dict(env, **{PARENT_ENV: str(os.getpid())})


@contextlib.contextmanager
def sigterm_ends_the_run(command: str = "amem compare") -> Iterator[None]:
    """While the block runs, SIGTERM prints one line and raises SystemExit(143), so the blocks
    around it unwind (Children ends its children). Only the main thread can set a handler; elsewhere
    this does nothing."""
    def terminated(signum, frame):
        print(f"{command}: terminated", file=sys.stderr)
        raise SystemExit(TERMINATED)

    with _handling({signal.SIGTERM: terminated}):
        yield


def die_with_parent() -> None:
    """In a child: be killed when the parent dies, whatever kills it (Linux; elsewhere nothing)."""
    parent = os.environ.get(PARENT_ENV)
    if not parent or not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != int(parent):  # the parent died before the request: nobody to signal this one
        os._exit(TERMINATED)
