"""What the report shows, computed in Python: per device the plotted series (downsampled), what
held memory at the peak (grouped, and stacked over time), the segment map at the peak, the
largest allocations with their call sites, out-of-memory panels, and the notes that qualify them.

The page's script only draws what this module computes, so every figure can be tested here.
"""
from __future__ import annotations

from typing import Any

from .breakdown import BlockLabels, by_call_site, by_category, held_at, stacked
from ..snapshot.callsite import CallSites
from .oom import oom_reports
from ..timeline import DeviceTimeline, Lifetime, build_timeline, downsample, free_runs, segments_at, top_lifetimes
from ..snapshot import device_extra, format_frames

MAX_POINTS = 4000  # per plotted series; peaks and troughs are kept
MAX_SEGMENT_ROWS = 120  # up to this many segments, one row each; beyond, the smaller ones are aggregated
DETAILED_ROWS = 48  # with more segments: the largest this many drawn block by block
MAX_BLOCKS_DRAWN = 20000
MAX_FOLDED = 100_000  # the largest allocations' table looks this far down the list for repeats of its rows
STATE_CODES = {"active_allocated": 0, "active_pending_free": 1}


def devices_with_data(snapshot: dict) -> list[int]:
    traces = snapshot.get("device_traces") or []
    seg_devices = {s.get("device", 0) for s in snapshot["segments"]}
    return sorted({d for d, t in enumerate(traces) if t} | seg_devices)


def _kept(tl: DeviceTimeline) -> list[int]:
    return downsample(len(tl.times), MAX_POINTS, [tl.allocated, tl.reserved])


def _series(tl: DeviceTimeline, keep: list[int]) -> dict[str, list]:
    frag = tl.fragmentation()
    return {"t": [tl.times[k] for k in keep], "allocated": [tl.allocated[k] for k in keep],
            "reserved": [tl.reserved[k] for k in keep], "fragmentation": [round(frag[k], 5) for k in keep]}


def _block_label(lt: Lifetime, state: str, sites: CallSites) -> str:
    where = f" at {sites(lt.frames)}" if lt.frames else ""
    tag = f" [{lt.tag}]" if lt.tag else ""
    return f"{state}: {lt.block} B block ({lt.size} B requested), stream {lt.stream}{tag}{where}"


def _segment_row(seg: dict, budget: list, sites: CallSites) -> dict:
    blocks = []
    for addr, lt, state in seg["blocks"]:
        if budget[0] <= 0:
            break
        blocks.append([addr - seg["address"], lt.block, STATE_CODES.get(state, 0), _block_label(lt, state, sites)])
        budget[0] -= 1
    return {"address": hex(seg["address"]), "size": seg["size"], "stream": seg["stream"],
            "expandable": seg["expandable"], "blocks": blocks, "count": 1,
            "allocated": sum(lt.block for _, lt, s in seg["blocks"] if s == "active_allocated"),
            "pending": sum(lt.block for _, lt, s in seg["blocks"] if s == "active_pending_free")}


def _size_class(size: int) -> int:
    """Segments are aggregated by power-of-two size class: (2^(k-1), 2^k]."""
    return max(0, (size - 1).bit_length())


def _aggregate_rows(segments: list) -> list[dict]:
    groups: dict[tuple, dict] = {}
    for seg in segments:
        key = (seg["stream"], seg["expandable"], _size_class(seg["size"]))
        g = groups.setdefault(key, {"address": "", "size": 0, "stream": seg["stream"], "expandable": seg["expandable"],
                                    "blocks": [], "count": 0, "allocated": 0, "pending": 0, "aggregate": True,
                                    "smallest": seg["size"], "largest": seg["size"]})
        g["count"] += 1
        g["size"] += seg["size"]
        g["smallest"], g["largest"] = min(g["smallest"], seg["size"]), max(g["largest"], seg["size"])
        g["allocated"] += sum(lt.block for _, lt, s in seg["blocks"] if s == "active_allocated")
        g["pending"] += sum(lt.block for _, lt, s in seg["blocks"] if s == "active_pending_free")
    return sorted(groups.values(), key=lambda g: (-g["largest"], g["stream"], g["expandable"]))


def _segment_rows(segments: list, sites: CallSites) -> tuple[list, dict]:
    """Every segment: one row each when there are few; else the largest one row each (blocks drawn)
    and the rest aggregated per stream and power-of-two size class (filled by state)."""
    ranked = sorted(segments, key=lambda s: (-s["size"], s["address"]))
    budget = [MAX_BLOCKS_DRAWN]
    if len(ranked) <= MAX_SEGMENT_ROWS:
        return [_segment_row(seg, budget, sites) for seg in ranked], {"count": 0, "segments": 0, "bytes": 0}
    rows = [_segment_row(seg, budget, sites) for seg in ranked[:DETAILED_ROWS]]
    rest = ranked[DETAILED_ROWS:]
    rows += _aggregate_rows(rest)
    return rows, {"count": len(rows) - DETAILED_ROWS, "segments": len(rest), "bytes": sum(s["size"] for s in rest)}


def _segment_map(snapshot: dict, tl: DeviceTimeline, point: int, sites: CallSites) -> dict[str, Any]:
    segments, unplaced = segments_at(snapshot, tl, point)
    rows, aggregated = _segment_rows(segments, sites)
    free_blocks = free_runs(segments)
    return {"point": point, "t": tl.times[point] if tl.times else 0, "rows": rows, "aggregated": aggregated,
            "unplaced": unplaced, "segments": len(segments), "reserved": sum(s["size"] for s in segments),
            "allocated": sum(lt.block for s in segments for _, lt, st in s["blocks"]),
            "largest_free": max(free_blocks, default=0), "free": sum(free_blocks)}


def _top_rows(tl: DeviceTimeline, n: int, sites: CallSites) -> list[dict[str, Any]]:
    """The n largest allocations, repeats folded: blocks of one size, request, stream, tag and call
    site are one row (`count` of them, from the first one's allocation to the last one's free), so
    an eval loop's 400 equal batches take one row, not the whole table."""
    rows, by_key = [], {}
    for lt in top_lifetimes(tl, MAX_FOLDED):
        if len(rows) == n and lt.block < rows[-1]["block"]:
            break   # smaller than every row: no fold can take it
        start = tl.times[lt.start + 1] if lt.start >= 0 else None
        end = tl.times[lt.end + 1] if lt.end is not None else None
        key = (lt.block, lt.size, lt.stream, lt.tag, sites(lt.frames))
        if key in by_key:
            row = by_key[key]
            row["count"] += 1
            row["end"], row["live_at_end"] = end, lt.end is None
            continue
        if len(rows) == n:
            continue
        by_key[key] = {"block": lt.block, "size": lt.size, "stream": lt.stream, "address": hex(lt.addr),
                       "start": start, "end": end, "tag": lt.tag, "frames": format_frames(lt.frames, 40),
                       "site": key[-1], "live_at_start": lt.live_at_start, "live_at_end": lt.end is None, "count": 1}
        rows.append(by_key[key])
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


def _stacked_categories(tl: DeviceTimeline, keep: list[int], peak: int, prov: BlockLabels | None) -> dict | None:
    """Categories over time, when the Tracer's rows join this trace by allocation number."""
    if prov is None or not prov.by_seq or not any(lt.alloc_seq in prov.by_seq for lt in tl.lifetimes):
        return None
    return stacked(tl, keep, peak, by_category(prov), split_before=False)


def _peak_point(tl: DeviceTimeline, peak_time: float | None) -> int:
    """The allocated peak; with `peak_time` (in the trace's time_us) the last point at or before it
    instead: a prediction's peak, so that its page and its text name one moment."""
    if peak_time is None or tl.time_unit != "us":
        return tl.peak_point
    at = peak_time - tl.start_time_us
    return max((k for k, t in enumerate(tl.times) if t <= at), default=0)


def device_report(snapshot: dict, device: int, top: int, prov: BlockLabels | None = None,
                  replay_ooms: bool = True, peak_time: float | None = None) -> dict[str, Any]:
    tl = build_timeline(snapshot, device)
    peak, keep, sites = _peak_point(tl, peak_time), _kept(tl), CallSites()
    return {"device": device, "events": len(tl.events), "time_unit": tl.time_unit,
            "start_time_us": tl.start_time_us, "series": _series(tl, keep),
            "held": held_at(tl, peak, sites, prov), "stacked": stacked(tl, keep, peak, by_call_site(sites)),
            "stacked_categories": _stacked_categories(tl, keep, peak, prov),
            "oom_panels": oom_reports(snapshot, tl, sites, prov, replay_ooms),
            "ooms": [{"t": tl.times[i + 1], "size": size, "free": free, "stream": stream}
                     for i, size, free, stream in tl.ooms],
            "peak": {"t": tl.times[peak], "allocated": tl.allocated[peak], "reserved": tl.reserved[peak],
                     "peak_reserved": max(tl.reserved)},
            "end": {"allocated": tl.allocated[-1], "reserved": tl.reserved[-1]},
            "streams": sorted({e.get("stream", 0) for e in tl.events}),
            "segmap": _segment_map(snapshot, tl, peak, sites), "top": _top_rows(tl, top, sites),
            "notes": _device_notes(snapshot, device, tl)}


def report_data(snapshot: dict, top: int = 20, provenance: dict | None = None,
                replay_ooms: bool = True, peak_time: float | None = None) -> dict[str, Any]:
    """Everything the report shows, per device with data, as plain JSON-able values. A Tracer's
    JSON (provenance) adds category and module groups; replay_ooms=False skips replaying each
    out-of-memory error under every policy; `peak_time` names the peak (see _peak_point)."""
    prov = BlockLabels(provenance) if provenance is not None else None
    devices = [device_report(snapshot, d, top, prov, replay_ooms, peak_time) for d in devices_with_data(snapshot)]
    amem = snapshot.get("amem") or {}
    return {"devices": devices, "source": "amem_alloc" if amem else "torch",
            "generator": amem.get("generator", ""), "empty": not devices}
