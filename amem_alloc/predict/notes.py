"""What a prediction stood in for, estimated, or did not model, and where in the user's code.

Design note
-----------
A prediction computes no values, so some things it answers are stand-ins (a value read from a fake
CUDA tensor), some are estimates (memory a CUDA library takes that cannot be known without a GPU,
such as cuDNN's convolution workspace), and some are not modelled at all (compiled code predicted
as eager). Each is a `Note`, counted once per (kind, what, where): the user sees every one of them
beside the figures (text, JSON, report), never a silent approximation.

`where` is the innermost frame of the user's own code (outside torch, amem, the standard library
and site-packages), then the innermost library frame below it, if any: "train.py:42 (via
transformers/trainer.py:2301)". Library paths are shortened to the package. The user's file is as
Python names it (an absolute path, usually) while the script runs, so that an error names it
exactly; the prediction's outputs show it relative to the script's folder (`displayed`).

The notes of the session that is running now are reachable from anywhere in the engine through
`record(...)`; outside a session it does nothing.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field

from ..code_files import _AMEM_DIR, _PLUMBING, _STDLIB, display_path, is_script_runner, is_user_file, short_path  # noqa: F401 (re-exported)

STAND_IN = "stand-in"          # a value read answered with a stand-in; the run went on
UPPER_BOUND = "upper-bound"    # a data-dependent shape taken at its upper bound
ASSUMED = "assumed"            # a data-dependent size or value taken by the shape rule (--shapes)
ESTIMATE = "estimate"          # memory a kernel takes that cannot be known without a GPU, estimated
NOT_MODELLED = "not-modelled"  # something that ran but whose memory was not modelled as CUDA would
COMPILED = "compiled"          # a torch.compile region predicted as compiled (what torch decided, replayed)
WRITTEN_OUT = "written-out"    # steps of a loop not run, written out exactly from the steps run (decode_loop.py)
KINDS = (STAND_IN, UPPER_BOUND, ASSUMED, ESTIMATE, NOT_MODELLED, COMPILED, WRITTEN_OUT)


def call_site(skip: int = 1) -> str:
    """"user.py:12" or "user.py:12 (via package/file.py:34)" for the code running now; a library
    line alone when no user frame is on the stack. The walk begins `skip - 1` frames above
    call_site's own: 1 begins at call_site (amem's, passed over), 2 at its caller, 3 above that."""
    return frame_site(sys._getframe(skip - 1))


def frame_site(frame) -> str:
    """call_site()'s text for the code running in `frame` (a frame on the stack now)."""
    def running(f):
        while f is not None and not is_script_runner(f.f_code.co_filename):   # beyond it: amem's command line
            yield f.f_code.co_filename, f.f_lineno
            f = f.f_back
    return _site(running(frame))


def frames_site(frames: tuple) -> str:
    """call_site()'s text for frames recorded earlier (engine/storages.py's user_frames: (file,
    line, function), innermost first)."""
    return _site((filename, line) for filename, line, _ in frames)


def _site(frames) -> str:
    """The innermost user frame of (file, line)s, innermost first, by the innermost library frame
    below it (never amem's, the standard library's or Python's plumbing)."""
    user, library = None, None
    for name, line in frames:
        if is_user_file(name):
            user = f"{name}:{line}"
            break
        if library is None and not name.startswith((_AMEM_DIR, *_STDLIB, *_PLUMBING, "<")):
            library = f"{short_path(name)}:{line}"
    if user and library:
        return f"{user} (via {library})"
    return user or library or "?"


def displayed(where: str, base: str | None) -> str:
    """call_site()'s text with its user's file as code_files.display_path shows it (relative to
    `base`, the script's folder); the library line is already short."""
    site, via, library = where.partition(" (via ")
    filename, colon, line = site.rpartition(":")
    if not colon or not line.isdigit():
        return where
    return f"{display_path(filename, base)}:{line}{via}{library}"


@dataclass
class Note:
    kind: str        # one of KINDS
    what: str        # what was stood in for, estimated or not modelled, in words
    where: str       # call_site() of the first occurrence
    count: int = 1
    nbytes: int = 0  # for estimates: the bytes the estimate allocated (the largest seen)
    seen: dict = field(default_factory=dict)   # shape rule -> what each occurrence gave under it
    unit: str = ""   # of the numbers in `seen` ("rows")

    def as_dict(self) -> dict:
        out = {"kind": self.kind, "what": self.what, "where": self.where, "count": self.count,
               "bytes": self.nbytes}
        if self.seen:   # a size or value that depends on the shape rule: each rule's, where they differ
            out["what"] = f"{self.what}: {seen_text(self.seen, self.unit)}"
            out["seen"] = {rule: _summary(got) for rule, got in self.seen.items()}
        return out


def seen_text(seen: dict, unit: str) -> str:
    """"256 rows each, 2,048 in all; under --shapes upper: 0–1,024 rows, 2,048 in all": the first
    rule's figures (the session's), then another's where they differ and are known."""
    rules = list(seen)
    text = _figures(seen[rules[0]], unit)
    for rule in rules[1:]:
        got = seen[rule]
        if got != seen[rules[0]]:
            known = [g for g in got if g is not None]
            text += f"; under --shapes {rule}: " + (_figures(got, unit) if len(known) == len(got) else
                                                    (_figures(known, unit) + f" (of {len(known)} of the {len(got)})"
                                                     if known else "not followed (earlier sizes differ)"))
    return text


def _figures(got: list, unit: str) -> str:
    """Sizes (with a unit) as a range and a total; values read as each distinct value and how often."""
    if unit and got and all(isinstance(g, int) and not isinstance(g, bool) for g in got):
        total, low, high = sum(got), min(got), max(got)
        if low == high:
            return f"{low:,} {unit}" + (f" each, {total:,} in all" if len(got) > 1 else "")
        return f"{low:,}–{high:,} {unit}, {total:,} in all"
    tally: dict = {}
    for g in got:
        tally[repr(g)] = tally.get(repr(g), 0) + 1
    shown = [k if n == len(got) else f"{k} x{n}" for k, n in list(tally.items())[:4]]
    return ", ".join(shown) + (f", ... ({len(tally)} distinct)" if len(tally) > 4 else "")


def _summary(got: list) -> dict:
    if got and all(isinstance(g, int) and not isinstance(g, bool) for g in got):
        return {"min": min(got), "max": max(got), "total": sum(got), "n": len(got)}
    tally: dict = {}
    for g in got:
        tally[repr(g)] = tally.get(repr(g), 0) + 1
    return {"values": tally, "n": len(got)}


@dataclass
class Notes:
    """The notes of one prediction, in the order first seen."""
    items: dict = field(default_factory=dict)   # (kind, what, where) -> Note

    def add(self, kind: str, what: str, where: str, nbytes: int = 0, seen: dict | None = None,
            unit: str = "") -> Note:
        """One more occurrence; `seen` (shape rule -> what this occurrence gave under it, None where
        not known) is kept per rule, in the order first given."""
        if kind not in KINDS:
            raise ValueError(f"unknown note kind {kind!r}")
        key = (kind, what, where)
        note = self.items.get(key)
        if note is None:
            note = self.items[key] = Note(kind, what, where, 0, 0, {}, unit)
        note.count += 1
        note.nbytes = max(note.nbytes, int(nbytes))
        for rule, got in (seen or {}).items():
            note.seen.setdefault(rule, [None] * (note.count - 1)).append(got)
        return note

    def __iter__(self):
        return iter(self.items.values())

    def __len__(self) -> int:
        return len(self.items)

    def of_kind(self, kind: str) -> list[Note]:
        return [n for n in self if n.kind == kind]

    def as_list(self) -> list[dict]:
        return [n.as_dict() for n in self]


def current() -> Notes | None:
    """The notes of the prediction running now (state.py), or None outside one."""
    from . import state

    st = state.current()
    return st.notes if st is not None else None


def record(kind: str, what: str, nbytes: int = 0, where: str | None = None, seen: dict | None = None,
           unit: str = "") -> None:
    """Adds a note to the prediction running now (nothing outside one)."""
    notes = current()
    if notes is not None:
        notes.add(kind, what, where or call_site(2), nbytes, seen, unit)


class NotModelledError(RuntimeError):
    """The code did something a prediction cannot model (CUDA graphs, CUDA in a child process):
    the run cannot be predicted, and the message says what and where."""

    def __init__(self, what: str, where: str | None = None):
        self.what, self.where = what, where if where is not None else call_site(2)
        super().__init__(f"{self.where}: {what}")
