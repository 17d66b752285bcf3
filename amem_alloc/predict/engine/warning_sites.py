"""Warnings the program's calls raise, shown at the program's line.

Design note
-----------
A warning names the line `stacklevel` frames above the code that warns (torch's
`F.dropout2d`: stacklevel 2, the caller's line; a warning from torch's C++: the innermost Python
frame). Under prediction the device mode runs the bodies of torch's Python functions and the ops
themselves, so that frame is amem's (`device_mode.py:161: UserWarning: dropout2d: Received a 2-D
input ...`), where without amem it is the user's. While a prediction runs, a warning whose line
is one of amem's files is shown at the innermost frame of the user's code on the stack (where
there is one), as Python would have shown it. Filters and the once-per-line registry still see
amem's line, so a warning torch shows once per line may be shown once for all such calls.
"""
from __future__ import annotations

import sys
import warnings
from typing import Any

from ...code_files import _AMEM_DIR, is_user_file
from ...patching import PatchSet, declare

SHOWWARNING = declare("warnings", "showwarning", "a warning whose line is amem's (torch's code run under its modes) "
                      "is shown at the program's line, as without amem")


def _users_line() -> tuple[str, int] | None:
    frame = sys._getframe(2)
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            return frame.f_code.co_filename, frame.f_lineno
        frame = frame.f_back
    return None


def install(patches: PatchSet) -> None:
    """warnings.showwarning as the note says, until `patches` close."""
    shown = warnings.showwarning

    def showwarning(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None):
        if filename.startswith(_AMEM_DIR):
            found = _users_line()
            if found is not None:
                (filename, lineno), line = found, None
        return shown(message, category, filename, lineno, file, line)
    patches.apply(SHOWWARNING, warnings, "showwarning", showwarning)
