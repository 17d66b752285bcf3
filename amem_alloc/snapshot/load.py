"""Loading snapshots safely, and checking every field amem's readers use.

Loading refuses every class lookup (a snapshot holds only dicts, lists, tuples, numbers and
strings), then checks every field that amem's readers use. Anything wrong — an unreadable file,
a truncated or hostile pickle, a wrong type, a missing key, an unknown amem format version —
raises SnapshotError naming the file and the problem; nothing else escapes.

Checking fills in keys older torch formats leave out. parse_snapshot() does that on copies of
the dicts it is given, so the caller's dict is never changed; load_snapshot() works on the dicts
it just unpickled, which nobody else holds.
"""
from __future__ import annotations

import io
import math
import os
import pickle
from pathlib import Path
from typing import Any

from .format import FORMAT_VERSION, MAX_FILE_BYTES, SnapshotError


# ============================================================================ loading
class _Refused(pickle.UnpicklingError):
    """A class lookup the snapshot asked for and was refused."""


class _PlainDataUnpickler(pickle.Unpickler):
    """Builds only what pickle's opcodes build directly; every class lookup is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise _Refused(
            f"refused to load {module}.{name}: a snapshot may hold only plain data "
            "(dicts, lists, tuples, numbers, strings), never classes or functions")


def _unpickle(raw: bytes) -> Any:
    if not raw:
        raise ValueError("the file is empty")
    return _PlainDataUnpickler(io.BytesIO(raw)).load()


def load_snapshot(path: str | os.PathLike) -> dict:
    """Reads a snapshot written by amem or by torch (torch.cuda.memory._dump_snapshot), safely.

    No class is ever looked up, so no code in the file can run. Raises SnapshotError (a
    ValueError) naming the file and the problem for anything that is not a valid snapshot.
    """
    name = str(path)
    try:
        size = os.path.getsize(path)
        if size > MAX_FILE_BYTES:
            raise SnapshotError(f"{name}: {size} bytes is larger than amem reads ({MAX_FILE_BYTES} bytes)")
        raw = Path(path).read_bytes()
    except OSError as err:
        raise SnapshotError(f"{name}: cannot read it: {err.strerror or err}") from None
    try:
        data = _unpickle(raw)
    except RecursionError:
        raise SnapshotError(f"{name}: not a readable snapshot: nested too deeply") from None
    except Exception as err:  # noqa: BLE001 - every unpickling failure is the file's problem
        raise SnapshotError(f"{name}: not a readable snapshot: {_describe(err)}") from None
    return checked_snapshot(data, name, in_place=True)  # the dicts were just unpickled: ours


def _describe(err: BaseException) -> str:
    text = str(err) or type(err).__name__
    if isinstance(err, _Refused):
        return text
    if isinstance(err, EOFError) or "truncated" in text:
        return f"truncated or corrupt pickle ({text})"
    return f"not a pickle, or a corrupt one ({type(err).__name__}: {text})"


# ============================================================================ checking
class _Bad(Exception):
    """A problem found while checking; parse_snapshot turns it into a SnapshotError."""


def _int(obj: dict, key: str, where: str, default: Any = _Bad, minimum: int | None = None) -> int:
    value = obj.get(key, default)
    if value is _Bad:
        raise _Bad(f"{where}: missing key {key!r}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Bad(f"{where}: {key!r} must be an integer, got {type(value).__name__}")
    if (minimum is not None and value < minimum) or abs(value) >= 1 << 64:
        raise _Bad(f"{where}: {key!r} = {value} is out of range")
    return value


def _dict(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise _Bad(f"{where} must be a dict, got {type(value).__name__}")
    return value


def _list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise _Bad(f"{where} must be a list, got {type(value).__name__}")
    return value


class _FrameChecker:
    """Frames must be lists; each list is checked once (a hostile file may share one a million times).

    Entries are not checked: real torch files hold dicts and, in some, tuples of dicts; readers
    go through frame_fields(), which accepts anything.
    """

    def __init__(self) -> None:
        self._seen: set[int] = set()

    def __call__(self, obj: dict, where: str) -> None:
        frames = obj.setdefault("frames", [])
        if id(frames) not in self._seen:
            _list(frames, f"{where}.frames")
            self._seen.add(id(frames))


class _Checker:
    """Checks one snapshot; `own` gives the dict to fill in (a copy unless the dicts are ours)."""

    def __init__(self, in_place: bool) -> None:
        self.own = (lambda d: d) if in_place else dict
        self.frames = _FrameChecker()

    def block(self, b: Any, where: str, offset: int) -> dict:
        b = self.own(_dict(b, where))
        size = _int(b, "size", where, minimum=0)
        if not isinstance(b.get("state"), str):
            raise _Bad(f"{where}: 'state' must be a string")
        b.setdefault("address", offset)  # torch's oldest format lists blocks in order without addresses
        _int(b, "address", where)
        b.setdefault("requested_size", size)
        _int(b, "requested_size", where, minimum=0)
        self.frames(b, where)
        return b

    def segment(self, seg: Any, where: str) -> dict:
        seg = self.own(_dict(seg, where))
        for key in ("address", "total_size"):
            _int(seg, key, where, minimum=0)
        seg.setdefault("device", 0)
        seg.setdefault("stream", 0)
        for key in ("device", "stream"):
            _int(seg, key, where, minimum=0)
        offset, blocks = seg["address"], []
        for j, b in enumerate(_list(seg.get("blocks", []), f"{where}.blocks")):
            blocks.append(self.block(b, f"{where}.blocks[{j}]", offset))
            offset = blocks[-1]["address"] + blocks[-1]["size"]
        seg["blocks"] = blocks
        self.frames(seg, where)
        return seg

    def event(self, ev: Any, where: str) -> dict:
        ev = self.own(_dict(ev, where))
        if not isinstance(ev.get("action"), str):
            raise _Bad(f"{where}: 'action' must be a string")
        for key in ("device_free" if ev["action"] == "oom" else "addr", "size", "stream"):
            ev.setdefault(key, 0)  # readers index these; time_us stays absent if absent (no timestamps)
            _int(ev, key, where, minimum=0 if key != "addr" else None)
        t = ev.get("time_us", 0)
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or abs(t) >= 1 << 64:
            raise _Bad(f"{where}: 'time_us' must be a finite number")
        self.frames(ev, where)
        return ev

    def amem(self, amem: Any, traces: list) -> dict:
        amem = self.own(_dict(amem, "amem"))
        version = amem.get("version")
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise _Bad(f"amem: bad format version {version!r}")
        if version > FORMAT_VERSION:
            raise _Bad(f"amem format version {version} is newer than this amem reads (up to {FORMAT_VERSION}); "
                       "upgrade amem_alloc")
        tags = _dict(amem.setdefault("tags", {}), "amem.tags")
        if not all(isinstance(k, int) and isinstance(v, str) for k, v in tags.items()):
            raise _Bad("amem.tags must map integers to strings")
        devices = _list(amem.setdefault("devices", []), "amem.devices")
        for d, extra in enumerate(devices):
            if extra is not None:
                _check_device_extra(extra, d, traces[d] if d < len(traces) else [])
        return amem

    def snapshot(self, data: Any) -> dict:
        if isinstance(data, list):  # torch.cuda.memory_snapshot(): segments only
            data = {"segments": data, "device_traces": []}
        data = self.own(_dict(data, "the top level"))
        if "segments" not in data:
            raise _Bad("no 'segments' key: this is not a memory snapshot")
        data["segments"] = [self.segment(seg, f"segments[{i}]")
                            for i, seg in enumerate(_list(data["segments"], "segments"))]
        traces = _list(data.get("device_traces", []), "device_traces")
        data["device_traces"] = traces = [
            [self.event(ev, f"device_traces[{d}][{i}]") for i, ev in enumerate(_list(trace, f"device_traces[{d}]"))]
            for d, trace in enumerate(traces)]
        if data.get("amem") is not None:
            data["amem"] = self.amem(data["amem"], traces)
        return data


def _check_device_extra(extra: Any, d: int, trace: list) -> None:
    where = f"amem.devices[{d}]"
    extra = _dict(extra, where)
    for key in ("recorded", "dropped"):
        _int(extra, key, where, minimum=0, default=0)
    columns = _dict(extra.get("columns", {}), f"{where}.columns")
    for name, column in columns.items():
        column = _list(column, f"{where}.columns[{name!r}]")
        if len(column) != len(trace) or not all(isinstance(v, int) and not isinstance(v, bool) for v in column):
            raise _Bad(f"{where}.columns[{name!r}] must hold one integer per trace entry ({len(trace)})")
    for i, ev in enumerate(_list(extra.get("empty_cache", []), f"{where}.empty_cache")):
        for key in ("seq", "time_us"):
            _int(_dict(ev, f"{where}.empty_cache[{i}]"), key, f"{where}.empty_cache[{i}]")


def checked_snapshot(data: Any, source: str, in_place: bool) -> dict:
    """parse_snapshot's work; in_place=True fills in the given dicts (only for dicts nobody else holds)."""
    try:
        return _Checker(in_place).snapshot(data)
    except _Bad as err:
        raise SnapshotError(f"{source}: not a valid snapshot: {err}") from None
    except RecursionError:
        raise SnapshotError(f"{source}: not a valid snapshot: nested too deeply") from None


def parse_snapshot(data: Any, source: str = "<snapshot>") -> dict:
    """Checks a snapshot (a dict, or torch's older bare list of segments) and returns a checked copy.

    The copy fills in keys older torch formats leave out (block addresses, device, stream,
    frames, device_traces); `data` itself is never changed (frame lists are shared, not copied).
    Raises SnapshotError naming `source` and the first problem found.
    """
    return checked_snapshot(data, source, in_place=False)
