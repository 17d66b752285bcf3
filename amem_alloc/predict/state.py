"""What a running prediction keeps, in one object: the session's state, found through a ContextVar.

Design note
-----------
Everything a prediction session changes while it runs lives in its SessionState: the notes it
takes (stand-ins, estimates, what is not modelled), the autocast bookkeeping, the frees held for
other streams (stream_uses), and what torch.cuda's stand-ins answer (the current device and
stream of each thread; stream ids, like CUDA's handles, are the process's). Modules find the running state with `current()`, not
through globals of their own, so two sessions (nested, as a what-if's trial inside a prediction,
or one after another, as the ranks of a distributed job) never see each other's state.

`current()` reads a ContextVar set by the session's `enter`; a thread started inside the session
(the DataLoader's pinning thread, a user's worker thread) does not inherit the context, so it
falls back to the innermost state active in the process, which is the one that thread runs under.
"""
from __future__ import annotations

import contextvars
import threading
from typing import Any


class _PerThread(threading.local):
    """torch.cuda's per-thread answers: the current device index and the current stream."""

    def __init__(self) -> None:
        self.device_index = 0
        self.stream: Any = None


class SessionState:
    """The state of one prediction session (see the module's note)."""

    def __init__(self, session: Any = None) -> None:
        self.session = session
        self.notes: Any = None            # notes.Notes, the session's
        self.autocast_keys: set = set()   # storages autocast's casts made (engine/autocast.py)
        self.autocast_cache: dict = {}    # autocast's cast cache: id(leaf) -> (weakref to leaf, cast copy)
        self.stream_uses: Any = None      # engine/stream_uses.StreamUses
        self.thread = _PerThread()        # torch.cuda's current device and stream, per thread
        self.stand_in_callers: list = []  # (what, frames) a stand-in was handed to (engine/values.py `handed_to`)


_CURRENT: contextvars.ContextVar[SessionState | None] = contextvars.ContextVar("amem_predict_state", default=None)
_PROCESS: list[SessionState] = []   # every state entered in this process, innermost last


def enter(state: SessionState) -> contextvars.Token:
    _PROCESS.append(state)
    return _CURRENT.set(state)


def leave(state: SessionState, token: contextvars.Token) -> None:
    try:
        _CURRENT.reset(token)
    except ValueError:   # left from another context than the one that entered: clear it there
        _CURRENT.set(None)
    if state in _PROCESS:
        _PROCESS.remove(state)


def current() -> SessionState | None:
    """The running session's state: this context's, else the process's innermost (a thread
    started inside a session), else None (no prediction is running)."""
    st = _CURRENT.get()
    if st is not None and st in _PROCESS:
        return st
    return _PROCESS[-1] if _PROCESS else None


def active_states() -> list[SessionState]:
    """Every state active in the process, outermost first (a device sync reaches them all)."""
    return list(_PROCESS)
