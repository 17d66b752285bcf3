"""How `amem predict` ends when there is no prediction: its exit statuses (named in exit_status.py,
the convention in cli/main.py), and the one line it prints for each way a prediction fails. One
process and a distributed job (predict_ranks.py) end the same way.

    2    bad input (one line)
    3    under --strict, the code needs a value; or a shape depends on values with no upper bound
    4    the run cannot be predicted (CUDA graphs, CUDA in a child process): one line naming the limit;
         or amem itself failed inside the script (predict/failures.py decides: an exception raised by
         amem's own code, or by torch with a message only fake tensors cause): one line,
         "amem predict: cannot model <what> at <user file:line> (<library file:line>); please report
         it", never "the script failed"; --debug prints the traceback, amem's frames included, above it
    124  past --timeout
    the script's own status when it fails (its traceback printed as Python prints it)
"""
from __future__ import annotations

import sys

from . import exit_status
from .parser import one_line


def failures() -> tuple[type[BaseException], ...]:
    """What a prediction's run raises when there is no prediction to print (imported when asked:
    `amem --help` and the other commands do not load torch)."""
    from .. import user_script
    from ..predict import api, failures
    from ..predict import script as script_mod

    return (user_script.ScriptFailed, script_mod.PredictionTimeout, api.DataDependentError, api.NotModelledError,
            failures.AmemFailure)


def status_of(failure: BaseException, child_reports: list[dict] = (), debug: bool = False) -> int:
    """Prints the failure's one line (or the child processes' reports) and returns the exit status;
    with `debug`, amem's own failure's traceback above its line."""
    from .. import user_script
    from ..predict import api, failures
    from ..predict import script as script_mod

    if child_reports and isinstance(failure, (user_script.ScriptFailed, api.NotModelledError)):
        for r in child_reports:
            print(r["line"], file=sys.stderr)
        return exit_status.NOT_MODELLED
    if isinstance(failure, failures.AmemFailure):
        if debug and failure.details:
            print(failure.details, end="" if failure.details.endswith("\n") else "\n", file=sys.stderr)
        print(f"amem predict: {failure}", file=sys.stderr)
        return exit_status.NOT_MODELLED
    if isinstance(failure, user_script.ScriptFailed):
        print(f"amem predict: the script failed (exit status {failure.status}); no prediction", file=sys.stderr)
        return failure.status
    if isinstance(failure, script_mod.PredictionTimeout):
        print(f"amem predict: {failure}; no prediction (predict fewer steps with --steps N, or raise --timeout)",
              file=sys.stderr)
        return exit_status.TIMEOUT
    if isinstance(failure, api.DataDependentError):
        print(one_line(failure, "amem predict"), file=sys.stderr)
        return exit_status.DATA_DEPENDENT
    print(f"amem predict: {failure}; this run cannot be predicted", file=sys.stderr)
    return exit_status.NOT_MODELLED
