"""Loading untrusted snapshots in bounded time and memory, and checking every field amem's readers use.

Design note
-----------
A snapshot file may come from anywhere, so reading one must cost at most a small multiple of its
size, refuse what it cannot bound, and never run its code. In order:

1. Reading: a regular file only (a device, pipe or folder is refused before it is read: /dev/zero
   has no end), or `-` for standard input; at most max_trace_bytes() either way (MAX_FILE_BYTES,
   raised by `--max-trace-mb`).
2. Scanning: the opcodes are walked once in C++ (csrc/bind/pickle_scan.h, a few ms for a
   3 MB trace) before anything is built: a memo index out of order (9 bytes that would make the
   C unpickler reserve 4 GB), too many marks, stack values or items per opcode are refused.
3. Unpickling: CPython's C unpickler with every class lookup refused (a snapshot holds only
   dicts, lists, tuples, numbers and strings), so no code in the file can run.
4. Checking: every field readers use, with values in range (sizes, addresses and streams in
   0..2^63 - 1, devices below MAX_DEVICES, known actions, finite times). Sharing is where a small
   pickle grows without limit (one event referenced two million times is 4 MB on disk and 667 MB
   as JSON), so each segment, block, event and list of them must appear once, and the frame
   entries all stacks reference are counted, shared ones at each use, against a budget that
   grows with the file.

Anything wrong raises SnapshotError naming the file, what was wrong and the limit, in one line;
nothing else escapes. Checking fills in keys older torch formats leave out. parse_snapshot()
does that on copies of the dicts it is given, so the caller's dict is never changed;
load_snapshot() works on the dicts it just unpickled, which nobody else holds.
"""
from __future__ import annotations

import io
import math
import os
import pickle
import stat
import sys
from typing import Any

from .format import FORMAT_VERSION, MAX_FILE_BYTES, TORCH_ACTIONS, SnapshotError


# ============================================================================ limits
# What an untrusted file may cost. A refusal names the file, what was wrong and the limit.
MAX_MARKS = 1000              # pickle marks open at once (torch's and amem's files nest 7)
MAX_STACK = 1 << 20           # values on the unpickler's stack at once (real files: about 1,100)
MAX_BATCH = 1 << 20           # items one opcode gathers into a container (picklers batch 1,000)
MAX_DEVICES = 1024            # device indices 0..1023
MAX_VALUE = 1 << 63           # sizes, addresses and streams lie in 0 .. 2^63 - 1
FRAMES_PER_BYTE = 32          # frame entries all stacks may reference, per byte of the file ...
MIN_FRAME_BUDGET = 1 << 20    # ... and at least this many (shared stacks count at every use)
_max_bytes = [MAX_FILE_BYTES]  # the size cap in effect (amem's CLI: --max-trace-mb)

ADVICE = "this is not a snapshot that torch or amem wrote; check where it came from"
DAMAGED = "give a snapshot written by torch.cuda.memory._dump_snapshot or amem (a copy cut short: copy it again)"


def set_max_trace_bytes(max_bytes: int) -> None:
    """The largest file (or standard input) load_snapshot reads from now on in this process."""
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ValueError(f"amem: the trace size limit must be a positive number of bytes, got {max_bytes!r}")
    _max_bytes[0] = max_bytes


def max_trace_bytes() -> int:
    return _max_bytes[0]


def _refuse(name: str, what: str, limit: str, todo: str = ADVICE) -> SnapshotError:
    """The one line for a refused file: `path: what was wrong (the limit); what to do`."""
    return SnapshotError(f"{name}: {what} ({limit}); {todo}")


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.0f} MiB" if n >= 1 << 20 else f"{n:,} bytes"


# ============================================================================ reading
_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a pipe"), (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str:
    return next((kind for test, kind in _KINDS if test(mode)), "not a regular file")


def _read_bounded(f: Any, name: str, size_hint: int, max_bytes: int) -> bytes:
    """At most max_bytes from f; more is refused (a file may grow, a pipe says nothing of its size)."""
    chunks, total = [], 0
    while True:
        chunk = f.read(min(max(size_hint - total, 1 << 20), max_bytes + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
        if total > max_bytes:
            raise _refuse(name, f"more than {_mib(max_bytes)} to read", f"the limit is {_mib(max_bytes)}",
                          "raise it with --max-trace-mb (or load_snapshot(..., max_bytes=))")
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _read_file(path: str | os.PathLike, name: str, max_bytes: int) -> bytes:
    """A regular file's bytes; devices, pipes and folders are refused before anything is read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO must not wait for a writer
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _refuse(name, f"cannot read it: it is {_kind(info.st_mode)}, not a regular file",
                          "amem reads snapshot files, or - for standard input",
                          "save the snapshot to a file and give its path")
        if info.st_size > max_bytes:
            raise _refuse(name, f"{_mib(info.st_size)} is larger than amem reads", f"the limit is {_mib(max_bytes)}",
                          "raise it with --max-trace-mb (or load_snapshot(..., max_bytes=))")
        with io.FileIO(fd, "rb", closefd=False) as f:
            return _read_bounded(f, name, info.st_size + 1, max_bytes)
    finally:
        os.close(fd)


def read_trace_bytes(path: str | os.PathLike, max_bytes: int | None = None) -> bytes:
    """The bytes of a trace file, or of standard input for `-`, within the size cap."""
    max_bytes = max_trace_bytes() if max_bytes is None else max_bytes
    name = "standard input" if str(path) == "-" else str(path)
    try:
        if str(path) == "-":
            return _read_bounded(sys.stdin.buffer, name, 1 << 20, max_bytes)
        return _read_file(path, name, max_bytes)
    except OSError as err:
        raise SnapshotError(f"{name}: cannot read it: {err.strerror or err}") from None


# ============================================================================ unpickling
class _Refused(pickle.UnpicklingError):
    """A class lookup the snapshot asked for and was refused."""


class _PlainDataUnpickler(pickle.Unpickler):
    """Builds only what pickle's opcodes build directly; every class lookup is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise _Refused(
            f"refused to load {module}.{name}: a snapshot may hold only plain data "
            "(dicts, lists, tuples, numbers, strings), never classes or functions")


def _scan(raw: bytes, name: str) -> None:
    """The opcode scan (csrc/bind/pickle_scan.h): bounds the memo, marks and stack before unpickling."""
    from .. import _C

    scan = _C.scan_pickle(raw, MAX_MARKS, MAX_STACK, MAX_BATCH)
    if scan["refused"]:
        raise _refuse(name, f"a hostile pickle: {scan['problem']} at byte {scan['offset']}",
                      f"limits: {MAX_MARKS} marks, {MAX_STACK:,} stack values, {MAX_BATCH:,} items per opcode, "
                      "memo indices in order")
    if not scan["parsed"]:
        what = "truncated or corrupt pickle" if scan["problem"].startswith("truncated") else \
            "not a pickle, or a corrupt one"
        raise SnapshotError(f"{name}: not a readable snapshot: {what} ({scan['problem']} at byte {scan['offset']}); "
                            f"{DAMAGED}")


def _unpickle(raw: bytes, name: str) -> Any:
    if not raw:
        raise SnapshotError(f"{name}: not a readable snapshot: the file is empty; {DAMAGED}")
    _scan(raw, name)
    try:
        return _PlainDataUnpickler(io.BytesIO(raw)).load()
    except RecursionError:
        raise SnapshotError(f"{name}: not a readable snapshot: nested too deeply") from None
    except Exception as err:  # noqa: BLE001 - every unpickling failure is the file's problem
        raise SnapshotError(f"{name}: not a readable snapshot: {_describe(err)}; {DAMAGED}") from None


def load_snapshot(path: str | os.PathLike, max_bytes: int | None = None) -> dict:
    """Reads a snapshot written by amem or by torch (torch.cuda.memory._dump_snapshot), safely.

    No class is ever looked up, so no code in the file can run; `-` reads standard input. The
    file must be a regular file of at most max_bytes (default: max_trace_bytes()); its opcodes
    are scanned before unpickling (memo, nesting and container limits), and the checked snapshot
    lists every segment, block and event once, with sizes, addresses and streams in 0..2^63 and
    known actions. Raises SnapshotError (a ValueError) naming the file and the problem for
    anything that is not a valid snapshot, in bounded time and memory.
    """
    raw = read_trace_bytes(path, max_bytes)
    name = "standard input" if str(path) == "-" else str(path)
    data = _unpickle(raw, name)
    budget = max(MIN_FRAME_BUDGET, FRAMES_PER_BYTE * len(raw))
    return checked_snapshot(data, name, in_place=True, frame_budget=budget)  # just unpickled: ours


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


KNOWN_ACTIONS = frozenset(TORCH_ACTIONS) | {"annotate"}  # annotate: recent torch's user annotations


def _int(obj: dict, key: str, where: str, default: Any = _Bad, minimum: int | None = 0,
         maximum: int = MAX_VALUE) -> int:
    """An integer field in minimum .. maximum - 1 (sizes, addresses and streams: 0 .. 2^63 - 1)."""
    value = obj.get(key, default)
    if type(value) is int and 0 <= value < maximum:  # the common case, first
        return value
    if value is _Bad:
        raise _Bad(f"{where}: missing key {key!r}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Bad(f"{where}: {key!r} must be an integer, got {type(value).__name__}")
    if (minimum is not None and value < minimum) or value >= maximum or value <= -MAX_VALUE:
        low = "-2^63" if minimum is None else f"{minimum}"
        high = "2^63 - 1" if maximum == MAX_VALUE else f"{maximum - 1}"
        raise _Bad(f"{where}: {key!r} = {value} is out of range (it must lie in {low} .. {high})")
    return value


def _dict(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise _Bad(f"{where} must be a dict, got {type(value).__name__}")
    return value


def _list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise _Bad(f"{where} must be a list, got {type(value).__name__}")
    return value


class _Once:
    """Segments, blocks, events and their lists must each appear once: a pickle can reference one
    object a million times in a few bytes, and every reader would then walk it a million times."""

    def __init__(self) -> None:
        self._seen: dict[int, str] = {}

    def __call__(self, obj: Any, where: str) -> Any:
        if (first := self._seen.setdefault(id(obj), where)) is not where:
            raise _Bad(f"{where} is the same object as {first} (shared by reference; a snapshot lists "
                       "each segment, block and event once)")
        return obj


class _FrameChecker:
    """Frames must be lists; each list is checked once (a hostile file may share one a million times),
    and the entries all references reach are counted against a budget (None: unbounded), so a
    shared stack cannot make readers walk without limit.

    Entries are not checked: real torch files hold dicts and, in some, tuples of dicts; readers
    go through frame_fields(), which accepts anything.
    """

    def __init__(self, budget: int | None) -> None:
        self._seen: set[int] = set()
        self.budget, self.used = budget, 0

    def __call__(self, obj: dict, where: str) -> None:
        frames = obj.setdefault("frames", [])
        if id(frames) not in self._seen:
            _list(frames, f"{where}.frames")
            self._seen.add(id(frames))
        self.used += len(frames)
        if self.budget is not None and self.used > self.budget:
            raise _Bad(f"{where}: the stacks reference more than {self.budget:,} frame entries in all, counting a "
                       f"shared stack at each use (the limit: {FRAMES_PER_BYTE} per byte of the file, at least "
                       f"{MIN_FRAME_BUDGET:,})")


class _Checker:
    """Checks one snapshot; `own` gives the dict to fill in (a copy unless the dicts are ours)."""

    def __init__(self, in_place: bool, frame_budget: int | None = None, untrusted: bool = False) -> None:
        self.own = (lambda d: d) if in_place else dict
        self.frames = _FrameChecker(frame_budget)
        self.once = _Once() if untrusted else (lambda obj, where: obj)  # a caller's own dicts may share

    def block(self, b: Any, where: str, offset: int) -> dict:
        b = self.own(_dict(self.once(b, where), where))
        size = _int(b, "size", where)
        if not isinstance(b.get("state"), str):
            raise _Bad(f"{where}: 'state' must be a string")
        b.setdefault("address", offset)  # torch's oldest format lists blocks in order without addresses
        _int(b, "address", where)
        b.setdefault("requested_size", size)
        _int(b, "requested_size", where)
        self.frames(b, where)
        return b

    def segment(self, seg: Any, where: str) -> dict:
        seg = self.own(_dict(self.once(seg, where), where))
        for key in ("address", "total_size"):
            _int(seg, key, where)
        seg.setdefault("device", 0)
        seg.setdefault("stream", 0)
        _int(seg, "device", where, maximum=MAX_DEVICES)
        _int(seg, "stream", where)
        offset, blocks = seg["address"], []
        listed = seg.get("blocks")  # only the file's own lists are remembered (ids of freed defaults recur)
        for j, b in enumerate(_list([] if listed is None else self.once(listed, f"{where}.blocks"), f"{where}.blocks")):
            blocks.append(self.block(b, f"{where}.blocks[{j}]", offset))
            offset = blocks[-1]["address"] + blocks[-1]["size"]
        seg["blocks"] = blocks
        self.frames(seg, where)
        return seg

    def event(self, ev: Any, where: str) -> dict:
        ev = self.own(_dict(self.once(ev, where), where))
        action = ev.get("action")
        if not isinstance(action, str):
            raise _Bad(f"{where}: 'action' must be a string")
        if action not in KNOWN_ACTIONS:
            raise _Bad(f"{where}: unknown action {action[:40]!r} (known: {', '.join(sorted(KNOWN_ACTIONS))})")
        for key in ("device_free" if action == "oom" else "addr", "size", "stream"):
            ev.setdefault(key, 0)  # readers index these; time_us stays absent if absent (no timestamps)
            _int(ev, key, where)
        t = ev.get("time_us", 0)
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or abs(t) >= MAX_VALUE:
            raise _Bad(f"{where}: 'time_us' must be a finite number")
        self.frames(ev, where)
        return ev

    def trace(self, trace: Any, d: int) -> list:
        if d >= MAX_DEVICES:
            raise _Bad(f"device_traces has {d + 1} or more devices, more than {MAX_DEVICES}")
        where = f"device_traces[{d}]"
        return [self.event(ev, f"{where}[{i}]") for i, ev in enumerate(_list(self.once(trace, where), where))]

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
        if len(devices) > MAX_DEVICES:
            raise _Bad(f"amem.devices lists {len(devices)} devices, more than {MAX_DEVICES}")
        for d, extra in enumerate(devices):
            if extra is not None:
                _check_device_extra(self.once(extra, f"amem.devices[{d}]"), d, traces[d] if d < len(traces) else [],
                                    self.once)
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
        data["device_traces"] = traces = [self.trace(trace, d) for d, trace in enumerate(traces)]
        if data.get("amem") is not None:
            data["amem"] = self.amem(data["amem"], traces)
        return data


def _column_ok(column: list, n: int) -> bool:
    return len(column) == n and all(type(v) is int and 0 <= v < MAX_VALUE for v in column)


def _check_device_extra(extra: Any, d: int, trace: list, once: _Once) -> None:
    where = f"amem.devices[{d}]"
    extra = _dict(extra, where)
    for key in ("recorded", "dropped"):
        _int(extra, key, where, default=0)
    columns = _dict(extra.get("columns", {}), f"{where}.columns")
    for name, column in columns.items():
        column = _list(once(column, f"{where}.columns[{name!r}]"), f"{where}.columns[{name!r}]")
        if not _column_ok(column, len(trace)):
            raise _Bad(f"{where}.columns[{name!r}] must hold one integer per trace entry ({len(trace)}), "
                       "each in 0 .. 2^63 - 1")
    for i, ev in enumerate(_list(extra.get("empty_cache", []), f"{where}.empty_cache")):
        for key in ("seq", "time_us"):
            _int(_dict(ev, f"{where}.empty_cache[{i}]"), key, f"{where}.empty_cache[{i}]", minimum=None)


def checked_snapshot(data: Any, source: str, in_place: bool, frame_budget: int | None = None) -> dict:
    """parse_snapshot's work; in_place=True fills in the given dicts (only for dicts nobody else holds).

    A frame_budget marks data from an untrusted file (load_snapshot: it grows with the file's
    size): the frame entries all stacks reference are bounded by it, and each segment, block and
    event must appear once. A caller's own dicts (parse_snapshot) may share them.
    """
    try:
        return _Checker(in_place, frame_budget, untrusted=frame_budget is not None).snapshot(data)
    except _Bad as err:
        advice = "" if ";" in str(err) else f"; {DAMAGED}"
        raise SnapshotError(f"{source}: not a valid snapshot: {err}{advice}") from None
    except RecursionError:
        raise SnapshotError(f"{source}: not a valid snapshot: nested too deeply") from None


def parse_snapshot(data: Any, source: str = "<snapshot>") -> dict:
    """Checks a snapshot (a dict, or torch's older bare list of segments) and returns a checked copy.

    The copy fills in keys older torch formats leave out (block addresses, device, stream,
    frames, device_traces); `data` itself is never changed (frame lists are shared, not copied).
    Raises SnapshotError naming `source` and the first problem found.
    """
    return checked_snapshot(data, source, in_place=False)
