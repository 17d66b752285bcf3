"""Stack frames in snapshots: reading one entry, and formatting a stack for people.

torch's frame entries are {filename, line, name}; some real files hold a tuple of such dicts.
Readers go through frame_fields(), which accepts anything and never raises.
"""
from __future__ import annotations

from typing import Any


def frame_fields(frame: Any) -> tuple[str, int, str] | None:
    """(filename, line, name) of one frame entry, or None if it is not a frame.

    torch's entries are {filename, line, name}; some real files hold a tuple of such dicts
    (the same frame under two file names): the last one is used.
    """
    if isinstance(frame, (tuple, list)) and frame:
        frame = frame[-1]
    if not isinstance(frame, dict):
        return None
    filename, line, name = frame.get("filename", "?"), frame.get("line", 0), frame.get("name", "?")
    if not isinstance(line, int) or isinstance(line, bool):
        line = 0
    return (filename if isinstance(filename, str) else "?", line, name if isinstance(name, str) else "?")


def format_frames(frames: Any, limit: int = 8, python_only: bool = False) -> list[str]:
    """Up to `limit` frames as 'file:line:name', innermost first, torch's own noise left out.

    python_only keeps Python frames only (torch's stacks start with C++ frames of the allocator);
    it falls back to every frame when there is no Python frame.
    """
    out: list[str] = []
    for frame in frames if isinstance(frames, list) else []:
        fields = frame_fields(frame)
        if fields is None or any(s in fields[2] or s in fields[0] for s in _FRAME_NOISE):
            continue
        if python_only and not fields[0].endswith(".py"):
            continue
        out.append(f"{fields[0]}:{fields[1]}:{fields[2]}")
        if len(out) >= limit:
            break
    return out if out or not python_only else format_frames(frames, limit)


_FRAME_NOISE = ("unwind::unwind", "CapturedTraceback::gather", "gather_with_cpp", "PyEval_", "PyObject_",
                "PyFunction_", "core/boxing", "/Register", "/Redispatch", "ceval.c", "pycore_ceval.h")


