"""The interned Python stacks and tag names that allocator events refer to by id.

Design note
-----------
Every recorded event carries two small integers: `context` (the id of the Python stack that
allocated) and `tag` (the id of the name set by `amem_alloc.tag`). The tables that give those
ids meaning live here, apart from recording (which fills them) and the snapshot builder (which
reads them), so neither has to import the other to share them.

Identical stacks share one id, so a training loop that allocates from the same few lines costs a
dict lookup per allocation, not a new list. Frames inside the amem_alloc package are left out.
"""
from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

_PACKAGE_DIR = str(Path(__file__).resolve().parent) + os.sep

Frame = tuple  # (filename, line, name)


class InternTable:
    """Values <-> small positive ids (0 means none). Thread-safe; ids are never reused."""

    def __init__(self) -> None:
        self._ids: dict[Any, int] = {}
        self._values: list[Any] = [None]
        self._lock = threading.Lock()

    def intern(self, value: Any) -> int:
        found = self._ids.get(value)
        if found is not None:
            return found
        with self._lock:
            found = self._ids.get(value)
            if found is None:
                found = len(self._values)
                self._values.append(value)
                self._ids[value] = found
            return found

    def get(self, ident: int) -> Any:
        return self._values[ident] if 0 < ident < len(self._values) else None

    def items(self) -> list[tuple[int, Any]]:
        return [(i, v) for i, v in enumerate(self._values) if i > 0]


STACKS = InternTable()  # tuple of (filename, line, name), innermost first
TAGS = InternTable()  # tag names


def _python_stack() -> tuple[Frame, ...]:
    frame = sys._getframe(1)  # traceback.extract_stack() without reading source lines
    frames = []
    while frame is not None:
        code = frame.f_code
        if not code.co_filename.startswith(_PACKAGE_DIR):
            frames.append((code.co_filename, frame.f_lineno, code.co_name))
        frame = frame.f_back
    return tuple(frames)


def capture_stack() -> int:
    """The id of the calling Python stack (the stack capturer the C++ side calls)."""
    return STACKS.intern(_python_stack())


_FRAME_DICTS: dict[Frame, dict] = {}  # one dict per distinct frame, shared by every stack through it
_FRAME_LISTS: dict[int, list] = {}  # one list per stack id, kept for the next dump (periodic flushes)


def _frames(stack: tuple) -> list[dict]:
    for f in stack:
        if f not in _FRAME_DICTS:
            _FRAME_DICTS.setdefault(f, {"filename": f[0], "line": f[1], "name": f[2]})
    return list(map(_FRAME_DICTS.__getitem__, stack))


def frames_for(context: int) -> list[dict]:
    """Torch-style frames for a context id, innermost first; [] for 0 or an unknown id.

    Shared and read-only: each stack's list is built once per process, and each distinct frame
    is one dict shared by every stack through it. With 100k distinct stacks a dump built and
    pickled 5M frame dicts (most of a 2-minute exit dump); shared, pickle writes each frame and
    each stack once and refers to them after.
    """
    context = int(context)
    found = _FRAME_LISTS.get(context)
    if found is None:
        stack = STACKS.get(context)
        if stack is None:
            return []
        found = _FRAME_LISTS.setdefault(context, _frames(stack))
    return found


def intern_tag(name: str) -> int:
    return TAGS.intern(name)


def tag_name(ident: int) -> str | None:
    return TAGS.get(int(ident))


def tag_names() -> dict[int, str]:
    """Every tag id seen in this process -> its name."""
    return dict(TAGS.items())
