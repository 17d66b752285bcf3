"""The snapshot format: its readers' constants, its error, and reading amem's own events back.

A snapshot is the dict torch.cuda.memory._snapshot() returns, with amem's extras under "amem";
see amem_alloc/snapshot/__init__.py for the layout. The layout amem writes (FORMAT_VERSION,
EXTRA_COLUMNS, PICKLE_PROTOCOL) is defined by its writer, amem_alloc/snapshot_dump.py.
"""
from __future__ import annotations

from .. import _C
from ..snapshot_dump import EXTRA_COLUMNS, FORMAT_VERSION  # noqa: F401 - the writer's layout (load.py: the version)

MAX_FILE_BYTES = 512 << 20  # the default size cap of load_snapshot (--max-trace-mb raises it); loading
                            # costs about 10-20x the file's size in memory
TORCH_ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
                 "segment_map", "segment_unmap", "oom", "snapshot")
BLOCK_STATES = ("active_allocated", "active_pending_free", "inactive")


class SnapshotError(ValueError):
    """A snapshot that cannot be read: the message names the file and the problem."""


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
    """A request's block size under torch's minimum rounding (512 B, the core's own size policy:
    _C.round_size, never restated); 0 stays 0."""
    return 0 if size <= 0 else _C.round_size(size, "")


def tag_table(snapshot: dict) -> dict[int, str]:
    return dict((snapshot.get("amem") or {}).get("tags") or {})
