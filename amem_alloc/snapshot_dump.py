"""amem's allocators as a snapshot in torch's format: built from a device source, written to disk.

Design note
-----------
This is the writing side of amem_alloc/snapshot/ (which reads, checks and formats snapshots),
kept below it with the runtime modules because they write snapshots themselves: recording.py's
always-on dumps (exit, SIGTERM, OOM, periodic flush), torch_patch.py's
torch.cuda.memory._snapshot, and Allocator.snapshot(). The layout it writes (FORMAT_VERSION,
EXTRA_COLUMNS, PICKLE_PROTOCOL) is defined here, once; the readers import it from here.

A device's events become torch's trace entries (exactly torch's keys); what torch has no key for
goes to amem's extras: one column per extra field aligned with the trace (EXTRA_COLUMNS), the
empty_cache events, the ring's recorded/dropped counts and the allocator's stats. Stack ids
become frame lists through the interned stacks (amem_alloc.stacks), each stack's list and each
frame's dict built once per process and shared, so pickle writes each of them once.
"""
from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

from . import _C
from .atomic_write import atomic_file
from .sources import Source, device_source
from .stacks import frames_for
from .stacks import tag_names

FORMAT_VERSION = 1  # of the "amem" key; load_snapshot refuses newer ones
PICKLE_PROTOCOL = 4  # torch's web viewer reads protocol <= 4
EXTRA_COLUMNS = ("seq", "rounded_size", "thread", "tag", "context", "alloc_seq")


def _settings(source: Source) -> dict:
    canonical = source.settings()
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
    """The snapshot of a device source, as a dict.

    allocator: None for amem's CUDA allocators (every device in use), an amem_alloc.Allocator
    (host/sim backend, shown as device 0), or a handle from amem_alloc.sources.
    """
    from .version import __version__

    source = device_source(allocator)
    tags = tag_names()
    states = source.devices()
    n_devices = max((d for d, *_ in states), default=-1) + 1
    traces: list[list] = [[] for _ in range(n_devices)]
    extras: list[dict | None] = [None] * n_devices
    segments = []
    for device, trace, segs, stats in states:
        events = trace.get("events", [])
        traces[device], columns, empty_cache = _device_trace(events, tags, frames_for)
        extras[device] = {"recording": trace.get("recording", False), "max_entries": trace.get("max_entries", 0),
                          "recorded": trace.get("recorded", 0), "dropped": trace.get("dropped", 0),
                          "columns": columns, "empty_cache": empty_cache, "stats": stats}
        block_ctx, seg_ctx = _contexts(events)
        segments += [_segment(s, device, block_ctx, seg_ctx, frames_for) for s in segs]
    amem = {"version": FORMAT_VERSION, "generator": f"amem_alloc {__version__}",
            "backend": source.backend, "tags": tags, "devices": extras}
    rank = os.environ.get("RANK", "").strip()
    if rank.isdigit():  # under torchrun: which rank wrote it (amem report lays ranks side by side)
        amem["rank"] = int(rank)
    return {"segments": segments, "device_traces": traces, "allocator_settings": _settings(source),
            "amem": amem}


def write_snapshot(data: dict, path: str | os.PathLike) -> Path:
    """Writes a snapshot dict as it is (unchecked) as a protocol-4 pickle, atomically (amem_alloc.atomic_write);
    amem_alloc.snapshot.save_snapshot checks a dict from elsewhere first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, "wb") as f:
        pickle.dump(data, f, protocol=PICKLE_PROTOCOL)
    return path


def dump_snapshot(path: str | os.PathLike, allocator: Any = None) -> Path:
    """Writes the snapshot of a device source (see build_snapshot) to `path`.

    The file is torch.cuda.memory._snapshot()'s format (pickle protocol 4): torch's
    `python -m torch.cuda._memory_viz` and its web viewer read it; amem report renders it.
    build_snapshot's dict is written as built, not checked again: it comes from the core's typed
    records (checking 1M events took as long as building them), and load_snapshot checks every
    file it reads anyway.
    """
    return write_snapshot(build_snapshot(allocator), path)


