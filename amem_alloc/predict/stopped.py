"""The exceptions that end a prediction's run wherever they land: Ctrl-C's KeyboardInterrupt and
SIGTERM's Terminated (stop_signals.py raises both).

Terminated is no KeyboardInterrupt: under plain Python SIGTERM ends a script where it is, so the
script's own `except KeyboardInterrupt:` must not catch it and carry on as if its user had stopped it
(PyTorch's word_language_model prints "Exiting from training early", then loads a checkpoint it never
saved). Every path that lets Ctrl-C through lets both through (STOPPED).
"""
from __future__ import annotations


class Terminated(BaseException):
    """SIGTERM: the run unwinds as on Ctrl-C, its line "terminated" and the shell's status 143; no
    `except Exception` or `except KeyboardInterrupt` of the script's catches it."""


STOPPED = (KeyboardInterrupt, Terminated)
