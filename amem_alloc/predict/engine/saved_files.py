"""Checkpoints a predicted script saves: never written over a file that was there before.

Design note
-----------
A script saves checkpoints as it trains (`torch.save`, safetensors under `save_pretrained`), and
under prediction the tensors it saves are fake: the file holds zeros where the values would be
(torch writes a fake storage's bytes as zeros; safetensors_files.py). Written over a file that was
there before the prediction (the checkpoint of a real run, in the same output folder) it would
destroy that file. So a save holding fake tensors, to a path that exists and that this prediction
did not write itself, goes to a scratch folder instead, under the same name; a later `torch.load`
(or safetensors' `load_file`) of that path in the same prediction reads the copy, and the user's
file is untouched. A new path
is written where the script names it. Both are noted at the script's line. The scratch folder is
removed when the prediction ends.

A file the script itself opens for writing during the prediction (ultralytics writes its `last.pt`
from a byte buffer with `open(path, "wb")`) is one this prediction wrote, seen by a Python audit
hook on `open`: a later `torch.save` there writes where the script names it, not to a scratch
copy with a note that the file "was there before".

A save of fake tensors into a buffer or an open file is noted at the script's line (the bytes
hold zeros for the values), and a file that was there before the prediction, opened for writing
after such a save, is noted as one that may now hold them: the script writes it itself, which
amem cannot keep apart.

Not covered: other writers (numpy, json, a library's own format) write what they write; a test of
the path (`os.path.exists`) and `safe_open` where a library bound it at import (transformers) see
the user's file, which holds the same names and shapes where it is the same program's.
"""
from __future__ import annotations

import os
import shutil
from typing import Any

import torch

from ...patching import PatchSet, declare
from .. import notes, scratch
from .values import is_fake

SAVE = declare("torch, torch.serialization", "save", "a save of fake tensors never overwrites a file that was "
               "there: it goes to a scratch copy (saved_files.py)")
LOAD = declare("torch, torch.serialization", "load", "a path saved to a scratch copy is read from it (saved_files.py)")
WRITES = declare("the process's audit events", "open, os.rename, shutil.copyfile", "files the script writes, or "
                 "moves into place, are its own: later saves there are not kept apart (saved_files.py)")
KEPT_NOTE = ("{path} was there before the prediction: the script's save of fake tensors (zeros for values) went "
             "to a scratch copy, which later loads read; the file is untouched")
NEW_NOTE = "{path} written from fake tensors: zeros where the values would be (no value is computed under prediction)"
BUFFER_NOTE = ("a save of fake tensors into {what}: zeros where the values would be, and so in any file written "
               "from it (no value is computed under prediction)")
REWRITTEN_NOTE = ("{path} was there before the prediction and the script opened it for writing after a save of "
                  "fake tensors into a buffer: if it wrote that buffer there, the file now holds zeros where the "
                  "values were (amem cannot keep a file the script writes itself apart)")
_MAX_DEPTH = 8   # how deep a saved object is searched for fake tensors (a state dict's nesting is 3 or 4)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR


class SavedFiles:
    """The paths this prediction wrote, and those it kept apart in its scratch folder."""

    def __init__(self) -> None:
        self.folder: str | None = None
        self.copies: dict[str, str] = {}   # the user's path (real) -> its scratch copy
        self.written: set[str] = set()     # paths this prediction created where the script named them
        self.into_buffer = False           # a save of fake tensors went into a buffer or file object

    def target(self, path: Any) -> Any:
        """Where a save of fake tensors to `path` writes (see the note)."""
        real = os.path.realpath(os.fspath(path))
        if real in self.copies:
            return self.copies[real]
        if real in self.written or not os.path.exists(real):
            if real not in self.written:
                notes.record(notes.STAND_IN, NEW_NOTE.format(path=os.fspath(path)), where=notes.call_site(3))
            self.written.add(real)
            return path
        if self.folder is None:
            self.folder = scratch.make("saved")
        copy = os.path.join(self.folder, f"{len(self.copies)}-{os.path.basename(real)}")
        self.copies[real] = copy
        notes.record(notes.STAND_IN, KEPT_NOTE.format(path=os.fspath(path)), where=notes.call_site(3))
        return copy

    def saved_into(self, f: Any) -> None:
        """A save of fake tensors into a buffer or an open file (Lightning saves a checkpoint into
        a BytesIO, then writes it through fsspec), noted at the script's line."""
        name = getattr(f, "name", None)
        what = name if isinstance(name, str) else f"a buffer ({type(f).__name__})"
        notes.record(notes.STAND_IN, BUFFER_NOTE.format(what=what), where=notes.call_site(3))
        self.into_buffer = True

    def opened_for_writing(self, path: Any) -> None:
        """The script opened `path` to write it: from now on a file this prediction wrote."""
        real = os.path.realpath(os.fsdecode(path))
        if real in self.copies or real in self.written:
            return
        if self.into_buffer and os.path.exists(real):
            notes.record(notes.STAND_IN, REWRITTEN_NOTE.format(path=os.fsdecode(path)), where=notes.call_site(4))
        self.written.add(real)

    def on_write(self, event: str, args: tuple) -> None:
        """The audit events of the prediction: a file opened for writing is one it wrote, and so
        is one a file it wrote is renamed or copied to (fsspec's transactions, Lightning's
        checkpoints, write a temporary file and move it into place)."""
        if event == "open":
            path, mode, flags = args
            writes = any(c in mode for c in "wax+") if isinstance(mode, str) else bool((flags or 0) & _WRITE_FLAGS)
        else:
            source, path = args[0], args[1]
            writes = self.wrote(source)
        if writes and isinstance(path, (str, bytes, os.PathLike)):
            self.opened_for_writing(path)

    def wrote(self, path: Any) -> bool:
        return isinstance(path, (str, bytes, os.PathLike)) and os.path.realpath(os.fsdecode(path)) in self.written

    def source(self, path: Any) -> Any:
        """Where a load of `path` reads: its scratch copy, if a save went there."""
        return self.copies.get(os.path.realpath(os.fspath(path)), path)

    def close(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None


def _is_path(f: Any) -> bool:
    return isinstance(f, (str, os.PathLike))


def holds_fake(obj: Any, depth: int = 0) -> bool:
    """Whether a saved object holds a fake tensor (state dicts, modules, plain objects)."""
    if isinstance(obj, torch.Tensor):
        return is_fake(obj)
    if depth >= _MAX_DEPTH:
        return False
    if isinstance(obj, dict):
        return any(holds_fake(v, depth + 1) for v in obj.values())
    if isinstance(obj, (list, tuple, set, frozenset)):
        return any(holds_fake(v, depth + 1) for v in obj)
    if isinstance(obj, torch.nn.Module):
        return any(is_fake(t) for t in (*obj.parameters(), *obj.buffers()))
    attributes = getattr(obj, "__dict__", None)
    return isinstance(attributes, dict) and holds_fake(attributes, depth + 1)


def install(patches: PatchSet, saved: SavedFiles, known: Any) -> None:
    """torch.save and torch.load through `saved` (see the note); the scratch folder goes at the end.
    Inside a save, a fake tensor's unknown values are written as zeros (known.py: `saving`), to a
    file or a buffer alike."""
    import torch.serialization as serialization

    save, load = serialization.save, serialization.load

    def save_apart(obj, f, *args, **kwargs):
        if holds_fake(obj):
            if _is_path(f):
                f = saved.target(f)
            else:
                saved.saved_into(f)
        known.saving += 1
        try:
            return save(obj, f, *args, **kwargs)
        finally:
            known.saving -= 1

    def load_copy(f, *args, **kwargs):
        return load(saved.source(f) if _is_path(f) else f, *args, **kwargs)

    for owner in (torch, serialization):
        patches.apply(SAVE, owner, "save", save_apart)
        patches.apply(LOAD, owner, "load", load_copy)
    patches.callback(saved.close)
    patches.listen(WRITES, ("open", "os.rename", "shutil.copyfile"), saved.on_write)
