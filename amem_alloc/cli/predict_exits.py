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

With --json, each of these also writes `{"predicted": false, "failure": {"kind", "exit_status",
"says"}}` there (kind: script_failed, timeout, data_dependent, not_modelled, amem_failed), and for a
script that raised, "script_error": its exception in one line, where its own code raised it.
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


def status_of(failure: BaseException, child_reports: list[dict] = (), debug: bool = False,
              json_path: str | None = None) -> int:
    """Prints the failure's one line (or the child processes' reports) and returns the exit status;
    with `debug`, amem's own failure's traceback above its line; with `json_path` (--json), the
    failure written there as JSON, so that a caller reading it finds why there is no prediction."""
    from ..predict import failures

    if debug and isinstance(failure, failures.AmemFailure) and failure.details:
        print(failure.details, end="" if failure.details.endswith("\n") else "\n", file=sys.stderr)
    kind, status, lines = outcome(failure, child_reports)
    for line in lines:
        print(line, file=sys.stderr)
    if json_path:
        _write_failure(json_path, kind, status, lines, getattr(failure, "error", None))
    return status


def outcome(failure: BaseException, child_reports: list[dict] = ()) -> tuple[str, int, list[str]]:
    """(the kind of failure, the exit status, the lines that say it)."""
    from .. import user_script
    from ..predict import api, failures
    from ..predict import script as script_mod

    if child_reports and isinstance(failure, (user_script.ScriptFailed, api.NotModelledError)):
        return "not_modelled", exit_status.NOT_MODELLED, [r["line"] for r in child_reports]
    if isinstance(failure, failures.AmemFailure):
        return "amem_failed", exit_status.NOT_MODELLED, [f"amem predict: {failure}"]
    if isinstance(failure, user_script.ScriptFailed):
        return "script_failed", failure.status, [
            f"amem predict: the script failed (exit status {failure.status}); no prediction"]
    if isinstance(failure, script_mod.PredictionTimeout):
        return "timeout", exit_status.TIMEOUT, [
            f"amem predict: {failure}; no prediction (predict fewer steps with --steps N, or raise --timeout)"]
    if isinstance(failure, api.DataDependentError):
        return "data_dependent", exit_status.DATA_DEPENDENT, [one_line(failure, "amem predict")]
    return "not_modelled", exit_status.NOT_MODELLED, [f"amem predict: {failure}; this run cannot be predicted"]


def _write_failure(path: str, kind: str, status: int, lines: list[str], script_error: str | None) -> None:
    """`{"predicted": false, "failure": {...}}` at `path`, written whole (with the script's own
    exception in one line where it raised one); a path that cannot be written is said in one more
    line (the failure's status stands)."""
    import json

    from ..atomic_write import write_text

    failure = {"kind": kind, "exit_status": status, "says": lines}
    if script_error:
        failure["script_error"] = script_error
    data = {"predicted": False, "failure": failure}
    try:
        write_text(path, json.dumps(data, indent=1))
    except OSError as err:
        print(f"amem predict: {err if err.filename else f'cannot write {path}: {err.strerror or err}'}",
              file=sys.stderr)
