"""What the report shows, computed in Python: per device the plotted series (downsampled), the
segment map at the peak, the largest allocations, and the notes that qualify them.

The page's script only draws what this module computes, so every figure can be tested here.
"""
from __future__ import annotations

from typing import Any

from .timeline import DeviceTimeline, Lifetime, build_timeline, downsample, segments_at, top_lifetimes
from ..snapshot import device_extra, format_frames

MAX_POINTS = 4000  # per plotted series; peaks and troughs are kept
MAX_SEGMENT_ROWS = 64  # segments drawn in the map (largest first); the rest are summarised
MAX_BLOCKS_DRAWN = 20000
STATE_CODES = {"active_allocated": 0, "active_pending_free": 1}


def devices_with_data(snapshot: dict) -> list[int]:
    traces = snapshot.get("device_traces") or []
    seg_devices = {s.get("device", 0) for s in snapshot["segments"]}
    return sorted({d for d, t in enumerate(traces) if t} | seg_devices)


def _series(tl: DeviceTimeline) -> dict[str, list]:
    keep = downsample(len(tl.times), MAX_POINTS, [tl.allocated, tl.reserved])
    frag = tl.fragmentation()
    return {"t": [tl.times[k] for k in keep], "allocated": [tl.allocated[k] for k in keep],
            "reserved": [tl.reserved[k] for k in keep], "fragmentation": [round(frag[k], 5) for k in keep]}


def _block_label(lt: Lifetime, state: str) -> str:
    frames = format_frames(lt.frames, 1, python_only=True)
    where = f" at {frames[0]}" if frames else ""
    tag = f" [{lt.tag}]" if lt.tag else ""
    return f"{state}: {lt.block} B block ({lt.size} B requested), stream {lt.stream}{tag}{where}"


def _segment_rows(segments: list) -> tuple[list, dict]:
    ranked = sorted(segments, key=lambda s: (-s["size"], s["address"]))
    rows, drawn = [], 0
    for seg in ranked[:MAX_SEGMENT_ROWS]:
        blocks = []
        for addr, lt, state in seg["blocks"]:
            if drawn >= MAX_BLOCKS_DRAWN:
                break
            blocks.append([addr - seg["address"], lt.block, STATE_CODES.get(state, 0), _block_label(lt, state)])
            drawn += 1
        rows.append({"address": hex(seg["address"]), "size": seg["size"], "stream": seg["stream"],
                     "expandable": seg["expandable"], "blocks": blocks,
                     "allocated": sum(lt.block for _, lt, s in seg["blocks"] if s == "active_allocated")})
    rest = ranked[MAX_SEGMENT_ROWS:]
    hidden = {"count": len(rest), "bytes": sum(s["size"] for s in rest),
              "allocated": sum(lt.block for s in rest for _, lt, st in s["blocks"] if st == "active_allocated")}
    return rows, hidden


def _segment_map(snapshot: dict, tl: DeviceTimeline, point: int) -> dict[str, Any]:
    segments, unplaced = segments_at(snapshot, tl, point)
    rows, hidden = _segment_rows(segments)
    free_blocks = _free_runs(segments)
    return {"point": point, "t": tl.times[point] if tl.times else 0, "rows": rows, "hidden": hidden,
            "unplaced": unplaced, "segments": len(segments), "reserved": sum(s["size"] for s in segments),
            "allocated": sum(lt.block for s in segments for _, lt, st in s["blocks"]),
            "largest_free": max(free_blocks, default=0), "free": sum(free_blocks)}


def _free_runs(segments: list) -> list[int]:
    """The free gaps between active blocks of every segment (what a new request could use)."""
    runs = []
    for seg in segments:
        cursor, end = seg["address"], seg["address"] + seg["size"]
        for addr, lt, _ in seg["blocks"]:
            if addr > cursor:
                runs.append(addr - cursor)
            cursor = max(cursor, addr + lt.block)
        if end > cursor:
            runs.append(end - cursor)
    return runs


def _top_rows(tl: DeviceTimeline, n: int) -> list[dict[str, Any]]:
    rows = []
    for lt in top_lifetimes(tl, n):
        start = tl.times[lt.start + 1] if lt.start >= 0 else None
        end = tl.times[lt.end + 1] if lt.end is not None else None
        rows.append({"block": lt.block, "size": lt.size, "stream": lt.stream, "address": hex(lt.addr),
                     "start": start, "end": end, "tag": lt.tag, "frames": format_frames(lt.frames, 40),
                     "where": format_frames(lt.frames, 1, python_only=True),
                     "live_at_start": lt.live_at_start, "live_at_end": lt.end is None})
    return rows


def _device_notes(snapshot: dict, device: int, tl: DeviceTimeline) -> list[str]:
    notes = list(tl.notes)
    extra = device_extra(snapshot, device) or {}
    if extra.get("dropped"):
        notes.insert(0, f"The recording ring overflowed: the {extra['dropped']} oldest events were dropped, "
                        "so the trace starts mid-run.")
    if not tl.events:
        notes.append("No trace events for this device: only its state at the dump is shown.")
    unknown = sorted({e.get("action") for e in tl.events} - _KNOWN_ACTIONS)
    if unknown:
        notes.append(f"Events with actions amem does not know were skipped: {', '.join(map(str, unknown))}.")
    return notes


_KNOWN_ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
                  "segment_unmap", "oom", "snapshot"}


def device_report(snapshot: dict, device: int, top: int) -> dict[str, Any]:
    tl = build_timeline(snapshot, device)
    peak = tl.peak_point
    return {"device": device, "events": len(tl.events), "time_unit": tl.time_unit,
            "start_time_us": tl.start_time_us, "series": _series(tl),
            "ooms": [{"t": tl.times[i + 1], "size": size, "free": free, "stream": stream}
                     for i, size, free, stream in tl.ooms],
            "peak": {"t": tl.times[peak], "allocated": tl.allocated[peak], "reserved": tl.reserved[peak],
                     "peak_reserved": max(tl.reserved)},
            "end": {"allocated": tl.allocated[-1], "reserved": tl.reserved[-1]},
            "streams": sorted({e.get("stream", 0) for e in tl.events}),
            "segmap": _segment_map(snapshot, tl, peak), "top": _top_rows(tl, top),
            "notes": _device_notes(snapshot, device, tl)}


def report_data(snapshot: dict, top: int = 20) -> dict[str, Any]:
    """Everything the report shows, per device with data, as plain JSON-able values."""
    devices = [device_report(snapshot, d, top) for d in devices_with_data(snapshot)]
    amem = snapshot.get("amem") or {}
    return {"devices": devices, "source": "amem_alloc" if amem else "torch",
            "generator": amem.get("generator", ""), "empty": not devices}
