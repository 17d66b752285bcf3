"""Running a user's script under prediction: unchanged, as Python would, bounded in steps and time.

Design note
-----------
The script runs in this process as `__main__` (user_script.run: its own exit status, its own
traceback from its first frame); a KeyboardInterrupt goes on to the command, which says
"interrupted" in one line, as every command does. Two bounds keep a prediction short:

* steps: a training script usually loops for thousands of optimizer steps, and its memory
  reaches its steady state within the first few (the optimizer's state exists from the first
  step; gradients and activations repeat). After `steps` optimizer steps the script is stopped
  there (`StopPrediction`, a BaseException, so the script's own `except Exception` does not
  catch it) and the prediction covers what ran; the output says so. 0 runs the script to its end.
  With `write_repeats` (`--write-repeats`), where two steps in a row (from the third on) made the
  same allocations, the script is stopped there too and the steps left up to `steps` are written
  out from the last (repeat.py), not run: faster, for a loop that runs on past `steps` (what
  follows the loop, such as an evaluation, is not run either way once the script is stopped).
* time: past `timeout` seconds the script is stopped (`PredictionTimeout`) and no prediction is
  printed: what it would have allocated later is unknown.

Each optimizer step is a "step" marker in the recorded program; in a script that made no optimizer
(it updates its parameters itself), each backward pass is, and the output says so.

An exception that ends the script is the script's (its traceback printed, its exit status:
user_script.ScriptFailed) unless failures.py finds it amem's own failure: then it ends the run as
failures.AmemFailure, one line and exit status 4.
"""
from __future__ import annotations

import os
import signal
import threading
from typing import Any

from .. import script_steps, user_script
from . import batch_search, failures, repeat, script_logging
from .stopped import STOPPED
from .notes import NotModelledError, call_site
from .engine import values
from .engine.values import DataDependentError

DEFAULT_STEPS = 5
DEFAULT_TIMEOUT = 600.0


class StopPrediction(BaseException):
    """Raised into the script after its last predicted optimizer step."""


class SpawnedRanks(BaseException):
    """A one-process prediction found the job's ranks (distributed/spawn.py: the script spawned
    `nprocs` processes, joined a process group, or started torchrun's agent in its process with
    another script for the ranks): the command predicts them as ranks."""

    def __init__(self, nprocs: int, what: str, nnodes: int = 1, script: list[str] | None = None) -> None:
        super().__init__(what)
        self.nprocs, self.nnodes = nprocs, nnodes
        self.script = script   # what each rank runs, where it is not the script predicted (torchrun's agent)


class PredictionTimeout(BaseException):
    """Raised into the script when it runs past the prediction's time limit."""

    def __init__(self, seconds: float, where: str):
        super().__init__(f"the script ran past --timeout {seconds:g} s (it was at {where})")
        self.seconds, self.where = seconds, where


class _Deadline:
    """Raises PredictionTimeout in the main thread after `seconds` (SIGALRM; main thread only), and
    again every second after that until the script has stopped: one raise can be lost (Python
    swallows an exception raised inside a weakref callback or a __del__, and a script may catch it)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.armed = seconds > 0 and threading.current_thread() is threading.main_thread()

    def _fire(self, signum: int, frame: Any) -> None:
        if in_dropping_callback(frame):
            return   # raised there, Python would print "Exception ignored in ..." and drop it: next tick
        raise PredictionTimeout(self.seconds, call_site(1))

    def __enter__(self) -> "_Deadline":
        if self.armed:
            self.previous = signal.signal(signal.SIGALRM, self._fire)
            signal.setitimer(signal.ITIMER_REAL, self.seconds, 1.0)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous)


def in_dropping_callback(frame: Any) -> bool:
    """Whether `frame` runs inside one of amem's callbacks whose exceptions Python drops: the
    weak-reference callback that records a storage's free (storages.py), the garbage collector's
    phase callback (collector.py). An exception there cannot reach the script."""
    from .engine import collector, storages

    codes = storages.FREE_CALLBACK_CODES | collector.CALLBACK_CODES
    while frame is not None:
        if frame.f_code in codes:
            return True
        frame = frame.f_back
    return False


def run(argv: list[str], run: Any, steps: int = DEFAULT_STEPS, timeout: float = DEFAULT_TIMEOUT,
        write_repeats: bool = False) -> int:
    """Runs the script inside an active `predicting` block; returns the optimizer steps it made.
    user_script.ScriptFailed when it fails, failures.AmemFailure when amem failed inside it;
    DataDependentError, NotModelledError, PredictionTimeout, SpawnedRanks, KeyboardInterrupt and SIGTERM's
    Terminated go on (Ctrl-C, or the script's own raise, is the command's "interrupted", not
    a failure of the script)."""
    done = [0]

    def after_step(n: int) -> None:
        done[0] = n
        batch_search.note_if_inside()
        run.marker("step")
        if steps and n >= steps:
            raise StopPrediction
        if write_repeats and steps and _repeats(run):   # the rest written out, not run (repeat.py)
            run.written_out = steps - n
            raise StopPrediction

    try:
        with _Deadline(timeout), script_logging.handlers_removed_after():   # the next run adds its own
            return script_steps.run_steps(argv, after_step, reraise=(DataDependentError, NotModelledError,
                                                                    StopPrediction, PredictionTimeout,
                                                                    SpawnedRanks, *STOPPED),
                                         amems=amems_failure_of(argv, run),
                                         on_backward_step=lambda: _note_backward_steps(run))
    except StopPrediction:
        return done[0] + getattr(run, "written_out", 0)
    except NotModelledError as failure:   # after steps, a stand-in's consequence: the steps stand
        if not (done[0] and getattr(failure, "after_stand_in", False)):
            raise
        run.ended_by = ENDED_BY.format(steps=_count(done[0], _unit(getattr(run, "backward_steps", False))),
                                       failure=failure)
        return done[0]


ENDED_BY = ("the script ran {steps}, then stopped at {failure}: the figures cover the steps it ran, "
            "not what it would have done after")
BACKWARD_STEPS_NOTE = ("the script made no torch.optim optimizer (it updates its parameters itself): each backward "
                       "pass is a step for --steps")


def _note_backward_steps(run: Any) -> None:
    """The script's steps are its backward passes: noted, and the run's lines say so (stopped_after_line)."""
    from . import notes

    notes.record(notes.ASSUMED, BACKWARD_STEPS_NOTE)
    run.backward_steps = True


def amems_failure_of(argv: list[str], run: Any):
    """user_script's `amems` hook: the AmemFailure an exception ending the script is, or None. Its
    line names the user's files relative to the script's folder (a module's: the working folder,
    where `python -m` finds it)."""
    target, _, module = user_script.target_of(argv)
    folder = os.getcwd() if module else os.path.dirname(os.path.abspath(target))
    storages = getattr(getattr(run, "session", None), "storages", None)
    user_meta = (lambda: storages.holds("meta")) if storages is not None else (lambda: False)
    return lambda err: (failures.amems_failure(err, folder, (DataDependentError, NotModelledError), user_meta)
                        or values.failure_from_stand_in(err, folder))


def _repeats(run: Any) -> bool:
    recording = getattr(run, "recording", None)
    return recording is not None and repeat.last_steps_repeat(recording.ops, recording.markers)


def stopped_after_line(done: int, steps: int, written_out: int = 0, ended_by: str | None = None,
                       backward_steps: bool = False) -> str | None:
    """What the output says when --steps stopped the script, or a stand-in's consequence did
    (`ended_by`, run() says it), or None when it ran to its end. `backward_steps`: the script made
    no optimizer, and its steps were its backward passes."""
    unit = _unit(backward_steps)
    if ended_by:
        return ended_by
    if written_out:
        ran = done - written_out
        return (f"the script ran {_count(ran, unit)}; steps {ran + 1}-{done} repeat step {ran} exactly (steps "
                f"{ran - 1} and {ran} made the same allocations) and are written out, not run (--steps {steps}; "
                "--steps 0 runs it to its end)")
    if steps and done >= steps:
        return (f"the script was stopped after {_count(done, unit)} (--steps {steps}; --steps 0 runs it "
                "to its end): the figures cover what ran until then")
    if done == 1 and steps != 1:
        held = "the first's gradients" if backward_steps else "the optimizer's state"
        return (f"the script ended after 1 {unit}: the figures cover that step; a second step, run with {held} "
                "already held, often peaks higher (give the script more data or epochs to see it)")
    return None


def _unit(backward_steps: bool) -> str:
    """What a step is: the script's backward pass where it made no optimizer, else an optimizer step."""
    return "backward pass" if backward_steps else "optimizer step"


def _count(n: int, unit: str) -> str:
    """'3 optimizer steps', '1 backward pass', '2 backward passes'."""
    if n == 1:
        return f"1 {unit}"
    return f"{n} {unit}{'es' if unit.endswith('s') else 's'}"
