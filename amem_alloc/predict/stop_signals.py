"""Ctrl-C and SIGTERM while a prediction runs the user's script: either ends the run by an exception
that unwinds amem's blocks (its patches undone, its temporary folders removed), with one line.

Design note
-----------
Python's own SIGINT handler raises KeyboardInterrupt wherever the main thread is, and SIGTERM's
default ends the process at once: nothing of amem's runs, its scratch folders (children.py's,
the nvidia-smi stand-in's) stay behind and the script's buffered output is lost (`timeout 900
amem predict ...` ends so). While `unwinding()` is active both raise: Ctrl-C KeyboardInterrupt
(the command's "interrupted", 130), SIGTERM `Terminated` ("terminated", 143; no KeyboardInterrupt,
stopped.py says why).

Raised inside one of amem's callbacks whose exceptions Python drops (the weak-reference callback
that records a free, the garbage collector's phase callback: script.py's `in_dropping_callback`)
the exception would be printed as "Exception ignored in ..." and the run would go on, as a Ctrl-C
once did; there the signal is sent again a moment later instead.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Iterator

from .stopped import Terminated

RETRY_S = 0.05   # how soon a signal that landed in a dropping callback is sent again



def _handler(signum: int, frame: Any) -> None:
    from .script import in_dropping_callback

    if in_dropping_callback(frame):
        threading.Timer(RETRY_S, signal.raise_signal, (signum,)).start()
        return
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


@contextlib.contextmanager
def unwinding() -> Iterator[None]:
    """While the block runs, SIGINT and SIGTERM raise (see the note). Only the main thread can set
    a handler; elsewhere the block just runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
