"""Snapshots in PyTorch's format: build one from amem's allocators, dump it, load one safely.

Design note
-----------
A snapshot is the dict torch.cuda.memory._snapshot() returns, so torch's own tools
(`python -m torch.cuda._memory_viz stats|trace|segments|memory|trace_plot|segment_plot` and the
web viewer) read ours, and ours read theirs:

    {"segments": [{device, address, total_size, allocated_size, active_size, requested_size,
                   stream, segment_type, segment_pool_id, is_expandable, frames,
                   blocks: [{address, size, requested_size, state, frames}]}],
     "device_traces": [[{action, addr | device_free, size, stream, time_us, frames,
                         compile_context, user_metadata}, ...] per device],
     "allocator_settings": {...},
     "amem": {...}}                      # amem's extras; torch's tools never look at it

Trace entries hold exactly torch's keys. What torch has no key for lives under "amem"
(FORMAT_VERSION): per device the ring's recorded/dropped counts, the allocator's stats, one
column per extra field aligned with device_traces[d] (seq, rounded_size, thread, tag, context,
alloc_seq), and the `empty_cache` events, which torch's trace has no action for. The tag table
maps tag ids to names (each entry's user_metadata also carries its tag's name). With these,
amem_events() gives back amem's own events exactly (ours -> dump -> load -> ours).

Loading refuses every class lookup (a snapshot holds only dicts, lists, tuples, numbers and
strings), then checks every field that amem's readers use. Anything wrong — an unreadable
file, a truncated or hostile pickle, a wrong type, a missing key, an unknown amem format
version — raises SnapshotError naming the file and the problem; nothing else escapes.
"""
from __future__ import annotations

import io
import json
import math
import os
import pickle
import threading
from pathlib import Path
from typing import Any

from . import _C

FORMAT_VERSION = 1  # of the "amem" key; load_snapshot refuses newer ones
PICKLE_PROTOCOL = 4  # torch's web viewer reads protocol <= 4
EXTRA_COLUMNS = ("seq", "rounded_size", "thread", "tag", "context", "alloc_seq")
MAX_FILE_BYTES = 4 << 30  # refuse larger files rather than exhaust memory
TORCH_ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
                 "segment_map", "segment_unmap", "oom", "snapshot")
BLOCK_STATES = ("active_allocated", "active_pending_free", "inactive")


class SnapshotError(ValueError):
    """A snapshot that cannot be read: the message names the file and the problem."""


# ============================================================================ building
def _sources(allocator: Any) -> list[tuple[int, dict, list, dict]]:
    """(device, trace, segments, stats) per device, parsed from the core's JSON."""
    if allocator is not None:
        core = allocator._core
        return [(0, json.loads(core.trace_json()), json.loads(core.segments_json()),
                 json.loads(core.stats_json()))]
    out = []
    for d in _C.cuda_devices_in_use():
        trace = _C.cuda_trace_json(d)
        out.append((d, json.loads(trace) if trace else {"events": []},
                    json.loads(_C.cuda_segments_json(d) or "[]"), json.loads(_C.cuda_stats_json(d) or "{}")))
    return out


def _settings(allocator: Any) -> dict:
    canonical = allocator.settings if allocator is not None else _C.cuda_settings()
    settings = {"allocator": "amem_alloc", "AMEM_CONF": canonical}
    settings.update(json.loads(_C.config_json(canonical)))
    return settings


def _torch_event(ev: dict, frames: list, tags: dict) -> dict:
    where = "device_free" if ev["action"] == "oom" else "addr"
    return {"action": ev["action"], where: ev["addr"], "size": ev["size"], "stream": ev["stream"],
            "time_us": ev["time_us"], "frames": frames, "compile_context": "N/A",
            "user_metadata": tags.get(ev["tag"], "")}


_FRESH_CONTEXT = ("alloc", "segment_alloc", "segment_map", "oom")  # recorded inside the malloc call


def _event_context(ev: dict, block_ctx: dict) -> int:
    """The stack id to show for an event: a malloc's own stack; a free shows its block's allocation."""
    if ev["action"] in _FRESH_CONTEXT:
        return ev["context"]
    if ev["action"] in ("free_requested", "free_completed"):
        return block_ctx.get(ev["alloc_seq"], 0)
    return 0  # segment_free/unmap happen in a malloc or in empty_cache: no stack of their own


def _device_trace(events: list[dict], tags: dict, frames_for: Any) -> tuple[list, dict, list]:
    """torch's trace entries, amem's aligned extra columns, and the empty_cache events."""
    entries, columns, empty_cache = [], {c: [] for c in EXTRA_COLUMNS}, []
    block_ctx, _ = _contexts(events)
    for ev in events:
        if ev["action"] == "empty_cache":
            empty_cache.append({k: ev[k] for k in ("seq", "time_us", "thread", "tag", "context")})
            continue
        entries.append(_torch_event(ev, frames_for(_event_context(ev, block_ctx)), tags))
        for c in EXTRA_COLUMNS:
            columns[c].append(ev[c])
    return entries, columns, empty_cache


def _segment(seg: dict, device: int, block_ctx: dict, seg_ctx: dict, frames_for: Any) -> dict:
    blocks = [{"address": b["address"], "size": b["size"], "requested_size": b["requested_size"],
               "state": b["state"], "frames": frames_for(block_ctx.get(b["alloc_seq"], 0))
               if b["state"] != "inactive" else []} for b in seg["blocks"]]
    return {"device": device, "address": seg["address"], "total_size": seg["total_size"],
            "allocated_size": seg["allocated_size"], "active_size": seg["active_size"],
            "requested_size": seg["requested_size"], "stream": seg["stream"],
            "segment_type": seg["segment_type"], "segment_pool_id": tuple(seg["segment_pool_id"]),
            "is_expandable": seg["is_expandable"],
            "frames": frames_for(seg_ctx.get(seg["address"], 0)), "blocks": blocks}


def _contexts(events: list[dict]) -> tuple[dict, dict]:
    """alloc_seq -> context of its alloc event; segment address -> context of its segment_alloc."""
    block_ctx = {e["alloc_seq"]: e["context"] for e in events if e["action"] == "alloc"}
    seg_ctx = {e["addr"]: e["context"] for e in events if e["action"] == "segment_alloc"}
    return block_ctx, seg_ctx


def build_snapshot(allocator: Any = None) -> dict:
    """The snapshot of amem's CUDA allocators (or of one host/sim Allocator), as a dict."""
    from . import __version__
    from .recording import frames_for as uncached_frames_for
    from .recording import tag_names

    cache: dict[int, list] = {}  # one list per stack: pickle then writes each stack once

    def frames_for(context: int) -> list:
        found = cache.get(context)
        if found is None:
            found = cache[context] = uncached_frames_for(context)
        return found

    tags = tag_names()
    sources = _sources(allocator)
    n_devices = max((d for d, *_ in sources), default=-1) + 1
    traces: list[list] = [[] for _ in range(n_devices)]
    extras: list[dict | None] = [None] * n_devices
    segments = []
    for device, trace, segs, stats in sources:
        events = trace.get("events", [])
        traces[device], columns, empty_cache = _device_trace(events, tags, frames_for)
        extras[device] = {"recording": trace.get("recording", False), "max_entries": trace.get("max_entries", 0),
                          "recorded": trace.get("recorded", 0), "dropped": trace.get("dropped", 0),
                          "columns": columns, "empty_cache": empty_cache, "stats": stats}
        block_ctx, seg_ctx = _contexts(events)
        segments += [_segment(s, device, block_ctx, seg_ctx, frames_for) for s in segs]
    amem = {"version": FORMAT_VERSION, "generator": f"amem_alloc {__version__}",
            "backend": "cuda" if allocator is None else allocator.backend, "tags": tags, "devices": extras}
    return {"segments": segments, "device_traces": traces, "allocator_settings": _settings(allocator),
            "amem": amem}


def save_snapshot(data: dict, path: str | os.PathLike) -> Path:
    """Writes a snapshot dict (checked first) as a protocol-4 pickle, atomically (write, then rename)."""
    data = parse_snapshot(data, str(path))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as f:
            pickle.dump(data, f, protocol=PICKLE_PROTOCOL)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def dump_snapshot(path: str | os.PathLike, allocator: Any = None) -> Path:
    """Writes the snapshot of amem's CUDA allocators (or of `allocator`) to `path`.

    The file is torch.cuda.memory._snapshot()'s format (pickle protocol 4): torch's
    `python -m torch.cuda._memory_viz` and its web viewer read it; amem report renders it.
    """
    return save_snapshot(build_snapshot(allocator), path)


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
    return parse_snapshot(data, name)


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


def _check_block(b: Any, where: str, offset: int, frames: _FrameChecker) -> int:
    b = _dict(b, where)
    size = _int(b, "size", where, minimum=0)
    if not isinstance(b.get("state"), str):
        raise _Bad(f"{where}: 'state' must be a string")
    b.setdefault("address", offset)  # torch's oldest format lists blocks in order without addresses
    _int(b, "address", where)
    b.setdefault("requested_size", size)
    _int(b, "requested_size", where, minimum=0)
    frames(b, where)
    return b["address"] + size


def _check_segment(seg: Any, where: str, frames: _FrameChecker) -> None:
    seg = _dict(seg, where)
    for key in ("address", "total_size"):
        _int(seg, key, where, minimum=0)
    seg.setdefault("device", 0)
    seg.setdefault("stream", 0)
    for key in ("device", "stream"):
        _int(seg, key, where, minimum=0)
    offset = seg["address"]
    for j, b in enumerate(_list(seg.setdefault("blocks", []), f"{where}.blocks")):
        offset = _check_block(b, f"{where}.blocks[{j}]", offset, frames)
    frames(seg, where)


def _check_event(ev: Any, where: str, frames: _FrameChecker) -> None:
    ev = _dict(ev, where)
    if not isinstance(ev.get("action"), str):
        raise _Bad(f"{where}: 'action' must be a string")
    for key in ("device_free" if ev["action"] == "oom" else "addr", "size", "stream"):
        ev.setdefault(key, 0)  # readers index these; time_us stays absent if absent (no timestamps)
        _int(ev, key, where, minimum=0 if key != "addr" else None)
    t = ev.get("time_us", 0)
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or abs(t) >= 1 << 64:
        raise _Bad(f"{where}: 'time_us' must be a finite number")
    frames(ev, where)


def _check_amem(amem: Any, traces: list) -> None:
    amem = _dict(amem, "amem")
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


def parse_snapshot(data: Any, source: str = "<snapshot>") -> dict:
    """Checks a snapshot (a dict, or torch's older bare list of segments) and returns it.

    Fills in keys older torch formats leave out (block addresses, device, stream, frames,
    device_traces). Raises SnapshotError naming `source` and the first problem found.
    """
    try:
        if isinstance(data, list):  # torch.cuda.memory_snapshot(): segments only
            data = {"segments": data, "device_traces": []}
        data = _dict(data, "the top level")
        if "segments" not in data:
            raise _Bad("no 'segments' key: this is not a memory snapshot")
        frames = _FrameChecker()
        for i, seg in enumerate(_list(data["segments"], "segments")):
            _check_segment(seg, f"segments[{i}]", frames)
        traces = _list(data.setdefault("device_traces", []), "device_traces")
        for d, trace in enumerate(traces):
            for i, ev in enumerate(_list(trace, f"device_traces[{d}]")):
                _check_event(ev, f"device_traces[{d}][{i}]", frames)
        if data.get("amem") is not None:
            _check_amem(data["amem"], traces)
    except _Bad as err:
        raise SnapshotError(f"{source}: not a valid snapshot: {err}") from None
    except RecursionError:
        raise SnapshotError(f"{source}: not a valid snapshot: nested too deeply") from None
    return data


# ============================================================================ reading back
def device_extra(snapshot: dict, device: int) -> dict | None:
    """amem's extras for one device of a snapshot amem wrote (None for torch's)."""
    amem = snapshot.get("amem") or {}
    devices = amem.get("devices") or []
    return devices[device] if 0 <= device < len(devices) else None


def amem_events(snapshot: dict, device: int) -> list[dict]:
    """A device's events in amem's own form (trace_json's), oldest first.

    For amem's dumps this is exactly what the core recorded, empty_cache included. For torch's
    snapshots the fields torch has no record of are filled in: seq is the entry's position,
    rounded_size is the request rounded up to 512 bytes, thread/tag/context/alloc_seq are 0.
    """
    traces = snapshot.get("device_traces") or []
    trace = traces[device] if 0 <= device < len(traces) else []
    extra = device_extra(snapshot, device) or {}
    columns = extra.get("columns") or {}
    events = []
    for i, ev in enumerate(trace):
        out = {"seq": i, "action": ev["action"], "addr": ev.get("device_free" if ev["action"] == "oom" else "addr", 0),
               "size": ev.get("size", 0), "rounded_size": round_block(ev.get("size", 0)),
               "stream": ev.get("stream", 0), "time_us": ev.get("time_us", 0),
               "thread": 0, "tag": 0, "context": 0, "alloc_seq": 0}
        out.update({c: columns[c][i] for c in EXTRA_COLUMNS if c in columns})
        events.append(out)
    for ev in extra.get("empty_cache") or []:
        events.append({"seq": ev["seq"], "action": "empty_cache", "addr": 0, "size": 0, "rounded_size": 0,
                       "stream": 0, "time_us": ev["time_us"], "thread": ev.get("thread", 0),
                       "tag": ev.get("tag", 0), "context": ev.get("context", 0), "alloc_seq": 0})
    return sorted(events, key=lambda e: e["seq"]) if extra.get("empty_cache") else events


def round_block(size: int) -> int:
    """A request's block size under torch's minimum rounding (512 B); 0 stays 0."""
    return 0 if size <= 0 else (size + 511) // 512 * 512


def tag_table(snapshot: dict) -> dict[int, str]:
    return dict((snapshot.get("amem") or {}).get("tags") or {})
