"""The handlers a run of the script adds to Python's logging, taken away when the run ends.

Design note
-----------
One command can run the script more than once in one process: once per what-if trial, and once
per rank recorded in turn. Python keeps its loggers for the life of the process, so a handler the
script added (`logger.addHandler(logging.StreamHandler())` at import, `logging.basicConfig(...)`)
was still there when the next run added its own: the k-th run printed each of its log lines k
times, and each FileHandler kept its file open.

While the script runs, `Logger.addHandler` notes each handler added from the user's own code (the
first frame outside the logging module is the user's file: code_files.is_user_file); when the run
ends, those still attached are removed and closed, so the next run starts with the loggers the
first one found. A handler a library adds stays (transformers adds its own once, at its first
import, and would not add it again to a later run in the same process).
"""
from __future__ import annotations

import contextlib
import logging
import sys
from typing import Iterator

from ..code_files import is_user_file
from ..patching import PatchSet, declare

ADD_HANDLER = declare("logging.Logger", "addHandler", "handlers the script adds are noted, and removed when its run "
                      "ends (a later run in the process, a what-if trial, would print each line twice)")


@contextlib.contextmanager
def handlers_removed_after() -> Iterator[None]:
    """The handlers the script's code adds inside the block, removed (and closed) as it ends."""
    added: list[tuple[logging.Logger, logging.Handler]] = []
    add = logging.Logger.addHandler

    def add_handler(logger: logging.Logger, handler: logging.Handler) -> None:
        if _from_user_code() and handler not in logger.handlers:
            added.append((logger, handler))
        add(logger, handler)

    with PatchSet() as patches:
        patches.apply(ADD_HANDLER, logging.Logger, "addHandler", add_handler)
        try:
            yield
        finally:
            for logger, handler in reversed(added):
                if handler in logger.handlers:
                    logger.removeHandler(handler)
                    with contextlib.suppress(Exception):   # a handler's own close: nothing to stop the run's end for
                        handler.close()


def _from_user_code() -> bool:
    """Whether the first caller outside logging (basicConfig adds from there) is the user's file."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename == logging.__file__:
        frame = frame.f_back
    return frame is not None and is_user_file(frame.f_code.co_filename)
