"""One more prediction of the same code, for a what-if or a fit trial: the run's failures become
a TrialFailed with one line instead of an exit status.

Design note
-----------
`amem predict` makes its own prediction (cli.py), printing each failure as it ends the command. A
what-if or an `amem fit` trial runs the code again in this process (the script as `__main__`
again; what it imported stays imported, which is what makes a trial take seconds) with, possibly,
a Change active (changes.py) around the code, and needs the failure as a value: the what-if
shows it in its row, fit treats it as "does not run at this value" or stops with one line.
"""
from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable

from ... import user_script
from .. import failures
from .. import script as script_mod
from ..notes import NotModelledError
from ..engine.values import DataDependentError


class TrialFailed(Exception):
    """The code could not be predicted this time; str() is one line, `status` the exit status."""

    def __init__(self, line: str, status: int = 1) -> None:
        super().__init__(line)
        self.status = status


def script_body(argv: list[str], steps: int, timeout: float) -> Callable[[Any], None]:
    """The body that runs a script under prediction (`steps` optimizer steps, `timeout` seconds)."""
    def body(run: Any) -> None:
        run.steps_run = script_mod.run(argv, run, steps, timeout)
    return body


def predict(body: Callable[[Any], None], predicting: Any, gpu: Any, policies: list, target: str, *,
            strict: bool = False, change: Any = None, shapes: str = "expected", debug: bool = False) -> Any:
    """The Prediction of body(run) under `predicting` (api.predicting, passed in: api uses this module)
    with `change` (a changes.Change, or None) active around the code. debug: amem's own failure's
    traceback is printed (stderr, where the script's own traceback goes) before its TrialFailed."""
    run = predicting(gpu, policies=policies, target=target, strict=strict, shapes=shapes)
    try:
        with run:
            with change if change is not None else contextlib.nullcontext():
                body(run)
    except user_script.ScriptFailed as failed:
        if change is not None:   # the unchanged run went through: the change is what failed
            raise TrialFailed(f"the script failed with the change applied (exit status {failed.status}), not "
                              "without it: amem could not apply it to this program", failed.status) from None
        raise TrialFailed(f"the script failed (exit status {failed.status})", failed.status) from None
    except script_mod.PredictionTimeout as late:
        raise TrialFailed(str(late), 124) from None
    except (DataDependentError, NotModelledError) as err:
        raise TrialFailed(_first_line(err), 3) from None
    except failures.AmemFailure as failure:   # amem failed inside the code: its line, exit status 4
        if debug and failure.details:
            print(failure.details, end="", file=sys.stderr)
        raise TrialFailed(str(failure), 4) from None
    if change is not None:
        change.finish()
    return run.result


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
