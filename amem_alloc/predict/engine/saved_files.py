"""Checkpoints a predicted script saves: never written over a file that was there before, never left.

Design note
-----------
A script saves checkpoints as it trains (`torch.save`, safetensors under `save_pretrained`), and
under prediction the tensors it saves are fake: the file holds zeros where the values would be
(torch writes a fake storage's bytes as zeros; safetensors_files.py). Written over a file that was
there before the prediction (the checkpoint of a real run, in the same output folder) it would
destroy that file. So a save holding fake tensors, to a path that exists and that this prediction
did not write itself, goes to a scratch folder instead, under the same name; a later `torch.load`
(or safetensors' `load_file`) of that path in the same prediction reads the copy, and the user's
file is untouched. A new path is written where the script names it, so that the script's own
tests and loads of it see it, and removed when the whole prediction ends, with the outermost
folder the prediction made for it (a Trainer's `checkpoint-500/`, config and tokenizer included):
left there, a real run resuming from the newest checkpoint in that folder would load zeros. Both
are noted at the script's line. The scratch folder is removed as the prediction ends.

A file saved from fake tensors and then moved over a file that was there before (a temporary
file os.replace()d onto `last.pth`: timm's checkpoints) sets that file aside first, in the scratch
folder, and puts it back as the prediction ends; copies and hard links of a file of zeros are
files of zeros (removed as it is).

The whole prediction: `whole_prediction()` around every run of the script one command makes (ranks
in turn, what-if trials, a forked worker's ranks), so that rank 1 still finds what rank 0 saved
before a collective they both make (run_files.py keeps each run's new files out of the other runs'
sight until a real run of them would see them);
without it (`with amem_alloc.predicting()`) each prediction's end is the end. Folders are told
made by the `os.mkdir` audit event (`os.makedirs` makes each through it), renames followed.

A file the script itself opens for writing during the prediction (ultralytics writes its `last.pt`
from a byte buffer with `open(path, "wb")`) is one this prediction wrote, seen by a Python audit
hook on `open`: a later `torch.save` there writes where the script names it, not to a scratch
copy with a note that the file "was there before".

A save of fake tensors into a buffer or an open file is noted at the script's line (the bytes
hold zeros for the values), and a file that was there before the prediction, opened for writing
after such a save, is noted as one that may now hold them: the script writes it itself, which
amem cannot keep apart. A new file the script opened and saved into (`with open(p, "wb") as f:
torch.save(state, f)`) is one saved from fake tensors, as by its path; so is a new file whose size
at the end is that of a buffer such a save went into (Lightning saves its checkpoint into a BytesIO
and writes it through fsspec): both are removed at the end, noted. A file that was there before
is never taken for one (a new file moved over it is the script's own writing, noted above).

Other new files the script writes (images, logs, data: DreamBooth's class images, which a real run
takes as already made) stay, named in one note as the prediction ends; caches aside (downloads and
compiled kernels are a later run's as they are).

Not covered: a file written from part of a buffer, or from a buffer and more, stays, noted; other writers (numpy, json, a
library's own format) write what they write; a test of the path (`os.path.exists`) and `safe_open`
where a library bound it at import (transformers) see the user's file, which holds the same names
and shapes where it is the same program's.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from typing import Any, Iterator

import torch

from ...patching import PatchSet, declare
from .. import notes, scratch
from . import run_files
from .values import is_fake

SAVE = declare("torch, torch.serialization", "save", "a save of fake tensors never overwrites a file that was "
               "there: it goes to a scratch copy (saved_files.py)")
LOAD = declare("torch, torch.serialization", "load", "a path saved to a scratch copy is read from it (saved_files.py)")
WRITES = declare("the process's audit events", "open, os.rename, shutil.copyfile, os.link, os.mkdir", "files the script "
                 "writes, or moves into place, are its own: later saves there are not kept apart; folders it makes "
                 "for files saved from fake tensors go with them (saved_files.py)")
KEPT_NOTE = ("{path} was there before the prediction: the script's save of fake tensors (zeros for values) went "
             "to a scratch copy, which later loads read; the file is untouched")
NEW_NOTE = ("{path} written from fake tensors: zeros where the values would be (no value is computed under "
            "prediction); removed when the prediction ended, with any folder the prediction made for it")
BUFFER_NOTE = ("a save of fake tensors into {what}: zeros where the values would be, and so in any file written "
               "from it (no value is computed under prediction)")
REWRITTEN_NOTE = ("{path} was there before the prediction and the script opened it for writing after a save of "
                  "fake tensors into a buffer: if it wrote that buffer there, the file now holds zeros where the "
                  "values were (amem cannot keep a file the script writes itself apart)")
ASIDE_NOTE = ("{path} was there before the prediction and the script moved a file saved from fake tensors (zeros "
              "for values) over it: the file was set aside and put back when the prediction ended")
CREATED_NOTE = ("the script wrote {count} new file{s} outside caches ({listing}): written in a run that computes no "
                "value on the GPU, what they hold of such values is amem's stand-ins (what the script computed on "
                "the CPU, such as tokenized data, is real); a real run may take them as done (DreamBooth's class "
                "images): check them, or remove them before it")
_LISTED = 3   # new files named in CREATED_NOTE
_MAX_DEPTH = 8   # how deep a saved object is searched for fake tensors (a state dict's nesting is 3 or 4)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR


class SavedFiles:
    """The paths this prediction wrote, and those it kept apart in its scratch folder."""

    def __init__(self) -> None:
        self.folder: str | None = None
        self.copies: dict[str, str] = {}   # the user's path (real) -> its scratch copy
        self.written: set[str] = set()     # paths this prediction created where the script named them
        self.zeros: set[str] = set()       # ... of them, those saved from fake tensors (removed at the end)
        self.made: set[str] = set()        # folders this prediction made
        self.created: dict[str, str] = {}  # files it made by opening them for writing -> the script's line
        self.aside: dict[str, str] = {}    # a file that was there, a file of zeros moved over it -> where it waits
        self.into_buffer = False           # a save of fake tensors went into a buffer or file object
        self.stamps: dict[str, int] = {}   # a new path -> its rank's collectives when it appeared (run_files.py)
        self.buffer_sizes: set[int] = set()   # sizes of the buffers saves of fake tensors went into
        self.replaced: set[str] = set()       # files that were there, a new one moved or copied over them

    def _appeared(self, real: str) -> None:
        self.stamps[real] = run_files.now()

    def target(self, path: Any) -> Any:
        """Where a save of fake tensors to `path` writes (see the note)."""
        real = _real(path)
        if real in self.copies:
            return self.copies[real]
        if real in self.written or not os.path.exists(real):
            if real not in self.written:
                notes.record(notes.STAND_IN, NEW_NOTE.format(path=os.fspath(path)), where=notes.call_site(3))
                self._appeared(real)
            self.written.add(real)
            self.zeros.add(real)
            return path
        if self.folder is None:
            self.folder = scratch.make("saved")
        copy = os.path.join(self.folder, f"{len(self.copies)}-{os.path.basename(real)}")
        self.copies[real] = copy
        notes.record(notes.STAND_IN, KEPT_NOTE.format(path=os.fspath(path)), where=notes.call_site(3))
        return copy

    def saved_into(self, f: Any) -> None:
        """A save of fake tensors into a buffer or an open file (Lightning saves a checkpoint into
        a BytesIO, then writes it through fsspec), noted at the script's line; a new file the script
        opened itself holds zeros as one saved by its path does."""
        name = getattr(f, "name", None)
        if isinstance(name, str) and _real(name) in self.created:   # a new file the script opened itself
            self.zeros.add(_real(name))
            notes.record(notes.STAND_IN, NEW_NOTE.format(path=name), where=notes.call_site(3))
            return
        what = name if isinstance(name, str) else f"a buffer ({type(f).__name__})"
        notes.record(notes.STAND_IN, BUFFER_NOTE.format(what=what), where=notes.call_site(3))
        self.into_buffer = True

    def saved_into_done(self, f: Any) -> None:
        """After a save of fake tensors into a buffer: its size, to tell at the end the new file
        written from it (Lightning writes its checkpoint from a BytesIO through fsspec)."""
        if getattr(f, "name", None) is not None:
            return
        with contextlib.suppress(Exception):   # a stream that cannot tell its size: noted only
            size = f.getbuffer().nbytes if hasattr(f, "getbuffer") else f.tell()
            if size > 0:
                self.buffer_sizes.add(size)

    def opened_for_writing(self, path: Any) -> None:
        """The script opened `path` to write it: from now on a file this prediction wrote."""
        real = _real(path)
        if real in self.copies or real in self.written:
            return
        if self.into_buffer and os.path.exists(real):
            notes.record(notes.STAND_IN, REWRITTEN_NOTE.format(path=os.fsdecode(path)), where=notes.call_site(4))
        if not os.path.lexists(real):
            self.created[real] = notes.call_site(4)
            self._appeared(real)
        self.written.add(real)

    def on_write(self, event: str, args: tuple) -> None:
        """The audit events of the prediction: a file opened for writing is one it wrote, and so
        is one a file it wrote is renamed or copied to (fsspec's transactions, Lightning's
        checkpoints, write a temporary file and move it into place). What another rank's paths
        given back write is not the script's (run_files.py), but later saves there are its own."""
        if run_files.restoring():
            if event == "shutil.copyfile" and _is_name(args[1]):
                self.written.add(_real(args[1]))
            return
        if event == "os.mkdir":
            self.making(args[0])
            return
        if event == "open":
            path, mode, flags = args
            writes = any(c in mode for c in "wax+") if isinstance(mode, str) else bool((flags or 0) & _WRITE_FLAGS)
        else:
            source, path = args[0], args[1]
            writes = self.wrote(source)
            if _is_name(source) and _is_name(path):
                self.passing_on(event, _real(source), _real(path))
        if writes and _is_name(path):
            self.opened_for_writing(path)

    def passing_on(self, event: str, source: str, path: str) -> None:
        """A rename, copy or hard link from `source` to `path`, about to be made. A file saved from
        fake tensors taken over a file that was there before (torch.save to a temporary file, then
        os.replace: timm's checkpoints) sets that file aside first, to be put back as the
        prediction ends; its copies and links hold zeros as it does."""
        if os.path.isfile(path) and path not in self.written:
            if source in self.zeros:
                self._set_aside(path)
            else:
                self.replaced.add(path)   # never taken for one written from a buffer (leftovers)
        if event == "os.rename":
            self.moved(source, path)
        elif source in self.zeros:
            if path not in self.written:
                notes.record(notes.STAND_IN, NEW_NOTE.format(path=path), where=notes.call_site(2))
                self._appeared(path)
            self.zeros.add(path)
            self.written.add(path)

    def _set_aside(self, path: str) -> None:
        if self.folder is None:
            self.folder = scratch.make("saved")
        aside = os.path.join(self.folder, f"aside-{len(self.aside)}-{os.path.basename(path)}")
        shutil.move(path, aside)
        self.aside[path] = aside
        notes.record(notes.STAND_IN, ASIDE_NOTE.format(path=path), where=notes.call_site(3))

    def making(self, path: Any) -> None:
        """A folder about to be made: one this prediction made, if it is not there yet."""
        if _is_name(path) and not os.path.lexists(path):
            self.made.add(_real(path))
            self._appeared(_real(path))

    def moved(self, source: str, path: str) -> None:
        """A rename: what this prediction wrote or made at `source`, or under it, is now at `path`
        (a Trainer saves into `tmp-checkpoint-500` and renames it)."""
        for paths in (self.zeros, self.made):
            for old in [p for p in paths if _within(p, source)]:
                paths.discard(old)
                paths.add(path + old[len(source):])
        for old in [p for p in self.created if _within(p, source)]:
            self.created[path + old[len(source):]] = self.created.pop(old)
        for old in [p for p in self.stamps if _within(p, source)]:   # there from now on
            del self.stamps[old]
            self._appeared(path + old[len(source):])

    def wrote(self, path: Any) -> bool:
        return _is_name(path) and _real(path) in self.written

    def source(self, path: Any) -> Any:
        """Where a load of `path` reads: its scratch copy, if a save went there."""
        return self.copies.get(_real(path), path)

    def leftovers(self) -> list[str]:
        """What to remove as the prediction ends: each file saved from fake tensors still there, or
        the outermost folder this prediction made that holds it; a new file the size of a buffer a
        save of fake tensors went into is one written from it."""
        for path in self.created:
            if path not in self.zeros and path not in self.replaced and _size(path) in self.buffer_sizes:
                self.zeros.add(path)
                notes.record(notes.STAND_IN, NEW_NOTE.format(path=path), where=self.created[path])
        out = set()
        for path in self.zeros:
            if os.path.lexists(path):
                top = path
                while os.path.dirname(top) in self.made:
                    top = os.path.dirname(top)
                out.add(top)
        return sorted(p for p in out if not any(p != q and _within(p, q) for q in out))

    def close(self) -> None:
        self._put_back()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None
        leftovers = self.leftovers()
        self._note_created(leftovers)
        hand_over(leftovers)
        run_files.run_ended(self.new_paths())

    def new_paths(self) -> dict[str, int | None]:
        """The new files and folders the run made, still there, outside caches: each with its
        stamp (run_files.py; None where not told)."""
        caches = _cache_folders()
        paths = {*self.made, *self.created, *self.zeros}
        return {p: self.stamps.get(p) for p in paths
                if os.path.lexists(p) and not _is_cache(p) and not any(_within(c, p) for c in caches)}

    def _put_back(self) -> None:
        """The files set aside, back in place of the zeros moved over them."""
        for path, aside in self.aside.items():
            with contextlib.suppress(OSError):
                os.remove(path)
            shutil.move(aside, path)
            self.zeros.discard(path)
        self.aside = {}

    def _note_created(self, leftovers: list[str]) -> None:
        """One note naming the new files the script wrote that stay (not the checkpoints removed,
        nor what it wrote in caches: downloads, compiled kernels, a dataset's cache)."""
        staying = [p for p in self.created if os.path.isfile(p) and not _is_cache(p)
                   and not any(_within(p, q) for q in leftovers)]
        if staying:
            more = f" and {len(staying) - _LISTED} more" if len(staying) > _LISTED else ""
            what = CREATED_NOTE.format(count=len(staying), s="s" if len(staying) > 1 else "",
                                       listing=", ".join(staying[:_LISTED]) + more)
            notes.record(notes.STAND_IN, what, where=self.created[staying[0]])


_HELD: list[list[str]] = []   # whole_prediction(): per level, the paths left to remove at its end


@contextlib.contextmanager
def whole_prediction(runs: bool = True) -> Iterator[list[str]]:
    """Every prediction inside the block hands the files it saved from fake tensors (and folders
    made for them) to the block's end, which removes them (see the note); nested, to the
    outermost's. Gives the list of them (a forked worker sends it to the process it records for)."""
    _HELD.append([])
    try:
        # each run's new files out of the later runs' sight until they would see them; a forked
        # worker's ranks (runs=False) are runs of the level it inherited
        with run_files.level() if runs else contextlib.nullcontext():
            yield _HELD[-1]
    finally:
        hand_over(_HELD.pop())


def hand_over(paths: list[str]) -> None:
    """`paths` removed now, or at the end of the whole prediction running."""
    if _HELD:
        _HELD[-1].extend(paths)
        return
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.remove(path)


def _cache_folders() -> list[str]:
    """Where libraries keep what a later run reuses as it is (downloads, compiled kernels)."""
    env = [os.environ.get(name) for name in ("XDG_CACHE_HOME", "HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE",
                                             "TRANSFORMERS_CACHE", "TORCH_HOME", "TRITON_CACHE_DIR",
                                             "TORCHINDUCTOR_CACHE_DIR")]
    return [_real(p) for p in (os.path.expanduser("~/.cache"), os.path.expanduser("~/.triton"), *env) if p]


def _is_cache(path: str) -> bool:
    """A cache's file, Python's bytecode, one in the temporary folders of torch's compiler and of
    amem (scratch.py), or Python source the run imported (code a library generated and loaded:
    PyTorch Geometric's layers, written to the temporary folder; it holds no value of the run)."""
    temporary = _real(tempfile.gettempdir()) + os.sep
    return ("__pycache__" in path.split(os.sep)
            or path.startswith((temporary + "torchinductor_", temporary + scratch.PREFIX))
            or any(path != folder and _within(path, folder) for folder in _cache_folders())
            or (path.endswith(".py") and path in _imported_files()))


def _imported_files() -> set[str]:
    return {_real(f) for f in (getattr(m, "__file__", None) for m in list(sys.modules.values())) if isinstance(f, str)}


def _within(path: str, folder: str) -> bool:
    """`path` is `folder` or inside it."""
    return path == folder or path.startswith(folder + os.sep)


def _real(path: Any) -> str:
    return os.path.realpath(os.fsdecode(path))


def _size(path: str) -> int | None:
    try:
        return os.path.getsize(path) if os.path.isfile(path) else None
    except OSError:
        return None


def _is_name(path: Any) -> bool:
    return isinstance(path, (str, bytes, os.PathLike))


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
        fake = holds_fake(obj)   # walked once: a state dict's every tensor
        if fake and _is_path(f):
            f = saved.target(f)
        elif fake:
            saved.saved_into(f)
        known.saving += 1
        try:
            out = save(obj, f, *args, **kwargs)
        finally:
            known.saving -= 1
        if fake and not _is_path(f):
            saved.saved_into_done(f)
        return out

    def load_copy(f, *args, **kwargs):
        return load(saved.source(f) if _is_path(f) else f, *args, **kwargs)

    run_files.run_started()
    for owner in (torch, serialization):
        patches.apply(SAVE, owner, "save", save_apart)
        patches.apply(LOAD, owner, "load", load_copy)
    patches.callback(saved.close)
    patches.listen(WRITES, ("open", "os.rename", "shutil.copyfile", "os.link", "os.mkdir"), saved.on_write)
