"""Exports of a snapshot's trace for other tools: Chrome trace / Perfetto JSON, and RMM's log CSV.

Design note
-----------
Both read a checked snapshot (ours or torch's) through report.timeline, so they agree with the
report on what was allocated when (see its note for how a trace that starts mid-run counts).

* chrome_trace(): the JSON "Trace Event Format" that chrome://tracing and ui.perfetto.dev open.
  One process per device ("GPU d"), with two counter tracks, `allocated` and `reserved`
  (bytes), an instant event per out-of-memory error (requested bytes, the device's free bytes),
  and one async slice per block lifetime, from its alloc to its free_completed, named by the
  user's call site as the report names it (snapshot/callsite.py: the user's frame or the
  autograd node, never torch's innermost frame), with its tag in brackets (args: address,
  requested and block bytes, stream, tag, call site, the top frames). Blocks live when recording
  began start at the trace's start; blocks still live end at its end (args say so). Timestamps
  are microseconds since the first event of any device, so every device is on one clock (an
  event at the same moment on two GPUs lines up); a trace without timestamps uses one
  microsecond per event of its device.
* rmm_csv(): the CSV that rmm::mr::logging_resource_adaptor writes and RMM's replay benchmark
  reads (benchmarks/utilities/log_parser.hpp): `Thread,Time,Action,Pointer,Size,Stream`, one
  row per allocate (at alloc) and free (at free_requested, when the caller frees), pointers
  in hex, time as HH:MM:SS.ffffff (UTC). Replay needs every free to follow its allocate: a
  block that was live when recording began gets an allocate row at the start. Out-of-memory
  errors are left out (the replay parser accepts only allocate and free).
"""
from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any

from . import atomic_write
from .timeline import DeviceTimeline, Lifetime, build_timeline
from .snapshot import format_frames
from .snapshot.callsite import NO_STACK, CallSites

RMM_HEADER = "Thread,Time,Action,Pointer,Size,Stream"
FORMATS = ("chrome", "rmm")


def devices_with_events(snapshot: dict) -> list[int]:
    return [d for d, trace in enumerate(snapshot.get("device_traces") or []) if trace]


# ============================================================================ Chrome trace
class _Clock:
    """One device's x values on the trace's one clock: microseconds since `t0`, the first event of
    any device; a device whose events lack timestamps counts one microsecond per event."""

    def __init__(self, tl: DeviceTimeline, t0: float) -> None:
        self.stamps = _stamps(tl)
        self.tl, self.offset = tl, (self.stamps[0] - t0) if self.stamps else 0

    def __call__(self, point: int) -> float:
        if self.stamps:   # point 0 is the start: the first event's moment
            return float(self.stamps[max(point - 1, 0)] + self.offset - self.stamps[0])
        return float(self.tl.times[point])


def _stamps(tl: DeviceTimeline) -> list | None:
    """The events' time_us, when every event has one (a device of one event too)."""
    stamps = [e.get("time_us") for e in tl.events]
    return stamps if stamps and all(isinstance(t, (int, float)) for t in stamps) else None


def _counter_events(tl: DeviceTimeline, pid: int, ts: _Clock) -> list[dict]:
    out = []
    for k in range(len(tl.times)):
        if k and tl.allocated[k] == tl.allocated[k - 1] and tl.reserved[k] == tl.reserved[k - 1]:
            continue
        for name, values in (("allocated", tl.allocated), ("reserved", tl.reserved)):
            out.append({"name": name, "ph": "C", "pid": pid, "tid": 0, "ts": ts(k), "args": {"bytes": values[k]}})
    return out


def _oom_events(tl: DeviceTimeline, pid: int, ts: _Clock) -> list[dict]:
    return [{"name": "out of memory", "ph": "i", "s": "p", "pid": pid, "tid": 0, "ts": ts(i + 1),
             "args": {"requested_bytes": size, "device_free_bytes": free, "stream": stream}}
            for i, size, free, stream in tl.ooms]


def slice_name(site: str, tag: str) -> str:
    """A block's slice: its call site, its tag in brackets; "block" when the trace has no stack."""
    name = "block" if site == NO_STACK else site
    return f"{name} [{tag}]" if tag else name


def _lifetime_events(tl: DeviceTimeline, pid: int, n: int, lt: Lifetime, ts: _Clock, sites: CallSites) -> list[dict]:
    start = ts(lt.start + 1 if lt.start >= 0 else 0)
    end = ts(lt.end + 1 if lt.end is not None else len(tl.times) - 1)
    site = sites(lt.frames)
    args = {"address": hex(lt.addr), "requested_bytes": lt.size, "block_bytes": lt.block, "stream": lt.stream,
            "tag": lt.tag, "call_site": site, "frames": format_frames(lt.frames, 5, python_only=True),
            "live_at_start": lt.live_at_start, "live_at_end": lt.end is None}
    common = {"cat": f"blocks stream {lt.stream}", "name": slice_name(site, lt.tag), "pid": pid, "tid": 0,
              "id": f"0x{n:x}"}
    return [{**common, "ph": "b", "ts": start, "args": args}, {**common, "ph": "e", "ts": max(start, end)}]


def chrome_trace(snapshot: dict) -> dict:
    """The snapshot's traces as a Chrome trace / Perfetto JSON object ({"traceEvents": [...]})."""
    events: list[dict] = []
    timelines = {d: build_timeline(snapshot, d) for d in devices_with_events(snapshot)}
    t0 = min((min(s) for s in map(_stamps, timelines.values()) if s), default=0)
    other = {"generator": "amem_alloc", "start_time_us": t0, "devices": {}}
    n, sites = 0, CallSites()
    for device, tl in timelines.items():
        pid, ts = device, _Clock(tl, t0)
        events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"GPU {device}"}})
        events += _counter_events(tl, pid, ts) + _oom_events(tl, pid, ts)
        for lt in tl.lifetimes:
            events += _lifetime_events(tl, pid, n, lt, ts, sites)
            n += 1
        other["devices"][str(device)] = {"start_time_us": tl.start_time_us, "offset_us": ts.offset,
                                         "time_unit": "us" if ts.stamps else "event", "notes": tl.notes}
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}


# ============================================================================ RMM CSV
def _clock(time_us: Any) -> str:
    if not isinstance(time_us, (int, float)) or not 0 <= time_us < 253402300800e6:  # year 9999
        return "00:00:00.000000"
    t = datetime.datetime.fromtimestamp(time_us / 1e6, tz=datetime.timezone.utc)
    return t.strftime("%H:%M:%S.%f")


def _threads(snapshot: dict, device: int, n: int) -> list[int]:
    amem = snapshot.get("amem") or {}
    devices = amem.get("devices") or []
    extra = devices[device] if device < len(devices) and devices[device] else {}
    column = (extra.get("columns") or {}).get("thread")
    return column if column is not None else [0] * n


def rmm_csv(snapshot: dict, device: int | None = None) -> str:
    """One device's trace as RMM's logging CSV (device None: the only device with events)."""
    device = _pick_device(snapshot, device)
    tl = build_timeline(snapshot, device)
    threads = _threads(snapshot, device, len(tl.events))
    rows = [RMM_HEADER]
    first_time = tl.events[0].get("time_us", 0) if tl.events else 0
    for lt in tl.lifetimes:  # blocks live before recording began, allocated "at the start"
        if lt.live_at_start and lt.freed_at is not None:
            rows.append(_row(threads[lt.freed_at], first_time, "allocate", lt))
    for i, ev in enumerate(tl.events):
        lt = tl.owner[i]
        if ev["action"] == "alloc":
            rows.append(_row(threads[i], ev.get("time_us", 0), "allocate", lt))
        elif ev["action"] == "free_requested":
            rows.append(_row(threads[i], ev.get("time_us", 0), "free", lt))
    return "\n".join(rows) + "\n"


def _row(thread: int, time_us: Any, action: str, lt: Lifetime) -> str:
    return f"{thread},{_clock(time_us)},{action},{lt.addr:#x},{lt.size},{lt.stream}"


def _pick_device(snapshot: dict, device: int | None) -> int:
    devices = devices_with_events(snapshot)
    if device is None:
        if len(devices) > 1:
            raise ValueError(f"amem: the trace has events on devices {devices}; choose one (--device)")
        return devices[0] if devices else 0
    if isinstance(device, bool) or not isinstance(device, int) or device < 0:
        raise ValueError(f"amem: bad device {device!r}")
    return device


# ============================================================================ files
def _device_path(out: Path, device: int) -> Path:
    """out.csv -> out.dev1.csv, as RMM names its per-device logs."""
    return out.with_name(f"{out.stem}.dev{device}{out.suffix}")


def write_export(snapshot: dict, out: str | os.PathLike, fmt: str, device: int | None = None) -> list[Path]:
    """Writes one export; returns the files written (RMM: one per device when several have events)."""
    out = Path(out)
    if fmt not in FORMATS:
        raise ValueError(f"amem: unknown export format {fmt!r}; choose one of {FORMATS}")
    if fmt == "chrome":
        return [atomic_write.write_text(out, json.dumps(chrome_trace(snapshot), separators=(",", ":")))]
    devices = devices_with_events(snapshot)
    if device is not None or len(devices) <= 1:
        return [atomic_write.write_text(out, rmm_csv(snapshot, device))]
    return [atomic_write.write_text(_device_path(out, d), rmm_csv(snapshot, d)) for d in devices]
