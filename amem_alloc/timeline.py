"""A device's memory over time, rebuilt from a snapshot's trace and its end state.

Design note
-----------
A trace lists events, not totals, and often starts mid-run, so the totals are rebuilt:

* allocated — a block counts from its `alloc` until its `free_completed` (when the allocator
  can reuse it; between free_requested and free_completed it is still held). Its size is the
  block size: amem's dumps record it; for torch's, the request rounded up to 512 B (torch's
  block can be larger when a remainder was too small to split — an approximation).
  A free with no alloc before it is a block that was live when recording began; blocks that
  are active in the end-state segments and never appear in the trace were live throughout.
  Both count from the start, so the curve never goes negative and ends at the true total.
* reserved — segment_alloc/segment_map add, segment_free/segment_unmap subtract. The start
  is the end-state segments' total minus the trace's net change (so the curve ends at the
  segments present at dump time), raised if needed so that it never goes negative — exact
  when the trace is complete, an estimate when events were dropped.
* the segment map at a point in time — the end-state segments and blocks, walked backwards
  through the events after that point (undoing each one). Exact for the blocks and segments
  the trace covers; blocks the trace never mentions are shown as they are at the end.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from .introspection import format_bytes
from .snapshot import device_extra, round_block, tag_table

SEGMENT_GROW = ("segment_alloc", "segment_map")
SEGMENT_SHRINK = ("segment_free", "segment_unmap")
ACTIVE = ("active_allocated", "active_pending_free")


@dataclass
class Lifetime:
    """One block's life: from alloc (or the trace's start) to free_completed (or the end)."""

    addr: int
    size: int  # requested bytes
    block: int  # block bytes (rounded)
    stream: int
    start: int  # event index of the alloc; -1 if live when recording began
    end: int | None = None  # event index of free_completed; None if live at the end
    freed_at: int | None = None  # event index of free_requested
    frames: list = field(default_factory=list)
    tag: str = ""
    alloc_seq: int | None = None  # amem's allocation number (amem's dumps), to join the Tracer's JSON

    @property
    def live_at_start(self) -> bool:
        return self.start < 0


@dataclass
class DeviceTimeline:
    device: int
    events: list  # the device's trace entries (torch's form)
    times: list  # x value per point: start point, then one per event
    time_unit: str  # "us" (microseconds since the first event) or "event" (no timestamps)
    allocated: list  # bytes per point
    reserved: list
    lifetimes: list  # every block seen, in order of first appearance
    owner: list  # event index -> its Lifetime (alloc/free events), else None
    ooms: list  # (event index, requested bytes, device free bytes, stream)
    notes: list
    start_time_us: float = 0
    live_at_end: dict = field(default_factory=dict)  # address -> Lifetime still open at the end

    @property
    def peak_point(self) -> int:
        """The point where allocated is highest (the first such point)."""
        return max(range(len(self.allocated)), key=lambda k: (self.allocated[k], -k)) if self.allocated else 0

    def fragmentation(self) -> list:
        return [0.0 if r <= 0 else min(1.0, max(0.0, 1 - a / r)) for a, r in zip(self.allocated, self.reserved)]


# ============================================================================ the forward pass
def _times(events: list) -> tuple[list, str, float]:
    stamps = [e.get("time_us") for e in events]
    if events and all("time_us" in e for e in events) and max(stamps) > min(stamps):
        t0 = min(stamps)
        return [0.0] + [t - t0 for t in stamps], "us", t0
    return list(range(len(events) + 1)), "event", 0


def _tag_of(i: int, ev: dict, tags: dict, tag_column: list | None) -> str:
    if tag_column is not None:
        return tags.get(tag_column[i], "")
    meta = ev.get("user_metadata", "")
    return meta if isinstance(meta, str) else ""


class _Walker:
    """Runs the events forward, pairing allocs with frees."""

    def __init__(self, tl: DeviceTimeline, rounded: list | None, tags: dict, tag_column: list | None,
                 seq_column: list | None = None):
        self.tl, self.rounded, self.tags, self.tag_column = tl, rounded, tags, tag_column
        self.seq_column = seq_column
        self.live: dict[int, Lifetime] = {}
        self.unpaired_allocs = 0

    def block_size(self, i: int, ev: dict) -> int:
        return self.rounded[i] if self.rounded is not None else round_block(ev.get("size", 0))

    def new_lifetime(self, i: int, ev: dict, start: int) -> Lifetime:
        lt = Lifetime(ev["addr"], ev.get("size", 0), self.block_size(i, ev), ev.get("stream", 0), start,
                      frames=ev.get("frames", []), tag=_tag_of(i, ev, self.tags, self.tag_column),
                      alloc_seq=self.seq_column[i] if self.seq_column is not None else None)
        self.tl.lifetimes.append(lt)
        return lt

    def step(self, i: int, ev: dict) -> tuple[int, int]:
        """(allocated change, reserved change) of event i."""
        action, addr = ev["action"], ev.get("addr", 0)
        if action == "alloc":
            delta = 0
            if addr in self.live:  # allocated twice without a free: events were dropped
                self.unpaired_allocs += 1
                old = self.live.pop(addr)
                old.end, delta = i, -old.block
            lt = self.live[addr] = self.new_lifetime(i, ev, i)
            self.tl.owner[i] = lt
            return delta + lt.block, 0
        if action == "free_requested":
            lt = self.live.get(addr) or self.live.setdefault(addr, self.new_lifetime(i, ev, -1))
            lt.freed_at, self.tl.owner[i] = i, lt
            return 0, 0
        if action == "free_completed":
            lt = self.live.pop(addr, None) or self.new_lifetime(i, ev, -1)
            lt.end, self.tl.owner[i] = i, lt
            return -lt.block, 0
        if action in SEGMENT_GROW:
            return 0, ev.get("size", 0)
        if action in SEGMENT_SHRINK:
            return 0, -ev.get("size", 0)
        if action == "oom":
            self.tl.ooms.append((i, ev.get("size", 0), ev.get("device_free", 0), ev.get("stream", 0)))
        return 0, 0


def _untouched_blocks(segments: list, live: dict, tl: DeviceTimeline) -> None:
    """Blocks active at the end that the trace never allocated: live since before it began."""
    for seg in segments:
        for b in seg["blocks"]:
            if b["state"] in ACTIVE and b["address"] not in live:
                lt = Lifetime(b["address"], b.get("requested_size", b["size"]), b["size"], seg["stream"], -1,
                              frames=b.get("frames", []))
                tl.lifetimes.append(lt)


def _prefix(deltas: list, start: int) -> list:
    out, total = [start], start
    for d in deltas:
        total += d
        out.append(total)
    return out


def _reserved(segments: list, deltas: list, tl: DeviceTimeline) -> list:
    end_total = sum(seg["total_size"] for seg in segments)
    sums = _prefix(deltas, 0)
    start = end_total - sums[-1]
    if start < -min(sums):
        tl.notes.append("The end-state segments do not match the segment events (events were dropped?): "
                        "reserved memory at the start was raised so that it never goes negative.")
        start = -min(sums)
    if start > 0 and any(d for d in deltas):
        tl.notes.append(f"Reserved memory at the start ({format_bytes(start)}) is estimated: the segments present "
                        "at the dump minus the segment events in the trace.")
    if not segments and not any(deltas):
        tl.notes.append("No segment information: reserved memory is unknown (shown as 0).")
    return [start + s for s in sums]


def build_timeline(snapshot: dict, device: int) -> DeviceTimeline:
    """The memory of one device of a (checked) snapshot over its trace."""
    traces = snapshot.get("device_traces") or []
    events = traces[device] if device < len(traces) else []
    segments = [s for s in snapshot["segments"] if s.get("device", 0) == device]
    times, unit, t0 = _times(events)
    tl = DeviceTimeline(device, events, times, unit, [], [], [], [None] * len(events), [], [], t0)
    columns = (device_extra(snapshot, device) or {}).get("columns") or {}
    walker = _Walker(tl, columns.get("rounded_size"), tag_table(snapshot), columns.get("tag"), columns.get("alloc_seq"))
    alloc_deltas, reserved_deltas = [], []
    for i, ev in enumerate(events):
        da, dr = walker.step(i, ev)
        alloc_deltas.append(da)
        reserved_deltas.append(dr)
    _untouched_blocks(segments, walker.live, tl)
    tl.live_at_end = walker.live
    start_allocated = sum(lt.block for lt in tl.lifetimes if lt.live_at_start)
    tl.allocated = _prefix(alloc_deltas, start_allocated)
    tl.reserved = _reserved(segments, reserved_deltas, tl)
    _timeline_notes(tl, walker, unit)
    return tl


def _timeline_notes(tl: DeviceTimeline, walker: _Walker, unit: str) -> None:
    early = [lt for lt in tl.lifetimes if lt.live_at_start]
    freed = [lt for lt in early if lt.end is not None or lt.freed_at is not None]
    if freed:
        tl.notes.append(f"The trace starts mid-run: {len(freed)} blocks freed in it were allocated before "
                        f"recording began ({format_bytes(sum(lt.block for lt in freed))}); they count as allocated "
                        "from the start.")
    if len(early) > len(freed):
        tl.notes.append(f"{len(early) - len(freed)} blocks active at the dump never appear in the trace "
                        f"({format_bytes(sum(lt.block for lt in early) - sum(lt.block for lt in freed))}): "
                        "live since before recording began.")
    if walker.unpaired_allocs:
        tl.notes.append(f"{walker.unpaired_allocs} addresses were allocated twice without a free in between "
                        "(events missing from the trace).")
    if unit == "event" and tl.events:
        tl.notes.append("The trace has no timestamps: the x axis counts events.")


# ============================================================================ the segment map
class _Intervals:
    """Reserved address ranges: [start, size, stream, expandable], sorted by start."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.items: list[list] = []

    def add(self, start: int, size: int, stream: int, expandable: bool) -> None:
        if size <= 0:
            return
        k = bisect.bisect_left(self.starts, start)
        self.starts.insert(k, start)
        self.items.insert(k, [start, size, stream, expandable])

    def remove(self, start: int, size: int) -> None:
        """Takes [start, start+size) out, cutting any range that overlaps it."""
        end = start + size
        k = max(0, bisect.bisect_right(self.starts, start) - 1)
        hits = []
        while k < len(self.items) and self.items[k][0] < end:
            if self.items[k][0] + self.items[k][1] > start:
                hits.append(k)
            k += 1
        cut = []
        for k in reversed(hits):
            s, n, stream, exp = self.items.pop(k)
            del self.starts[k]
            cut += [(s, start - s, stream, exp), (end, s + n - end, stream, exp)]
        for piece in cut:
            self.add(*piece)

    def merged(self) -> list[list]:
        """Adjacent pieces of an expandable segment become one."""
        out: list[list] = []
        for item in self.items:
            last = out[-1] if out else None
            if last and last[3] and item[3] and last[2] == item[2] and last[0] + last[1] == item[0]:
                last[1] += item[1]
            else:
                out.append(list(item))
        return out

    def find(self, addr: int) -> int:
        k = bisect.bisect_right(self.starts, addr) - 1
        return k if k >= 0 and addr < self.items[k][0] + self.items[k][1] else -1


def _undo(ev: dict, lt: Lifetime | None, blocks: dict, ranges: _Intervals) -> None:
    action, addr, size = ev["action"], ev.get("addr", 0), ev.get("size", 0)
    if action == "alloc":
        blocks.pop(addr, None)
    elif action == "free_requested" and lt is not None:
        blocks[addr] = ["active_allocated", lt]
    elif action == "free_completed" and lt is not None:
        blocks[addr] = ["active_pending_free" if lt.freed_at is not None else "active_allocated", lt]
    elif action in SEGMENT_GROW:
        ranges.remove(addr, size)
    elif action in SEGMENT_SHRINK:
        ranges.add(addr, size, ev.get("stream", 0), action == "segment_unmap")


def segments_at(snapshot: dict, tl: DeviceTimeline, point: int) -> tuple[list, dict]:
    """The segments and active blocks at a point of the timeline (0 = start, k = after event k-1).

    Returns (segments, unplaced): each segment {address, size, stream, expandable,
    blocks: [(address, Lifetime, state)]}; unplaced counts blocks that fall in no known segment.
    """
    ranges = _Intervals()
    blocks: dict[int, list] = {}
    for seg in snapshot["segments"]:
        if seg.get("device", 0) != tl.device:
            continue
        ranges.add(seg["address"], seg["total_size"], seg["stream"], bool(seg.get("is_expandable")))
        for b in seg["blocks"]:
            if b["state"] in ACTIVE:
                lt = tl.live_at_end.get(b["address"]) or Lifetime(
                    b["address"], b.get("requested_size", 0), b["size"], seg["stream"], -1, frames=b.get("frames", []))
                blocks[b["address"]] = [b["state"], lt]
    for i in range(len(tl.events) - 1, point - 1, -1):
        _undo(tl.events[i], tl.owner[i], blocks, ranges)
    return _place(ranges, blocks)


def _place(ranges: _Intervals, blocks: dict) -> tuple[list, dict]:
    merged = _Intervals()
    for start, size, stream, exp in ranges.merged():
        merged.add(start, size, stream, exp)
    out = [{"address": s, "size": n, "stream": st, "expandable": e, "blocks": []} for s, n, st, e in merged.items]
    unplaced = {"count": 0, "bytes": 0}
    for addr in sorted(blocks):
        state, lt = blocks[addr]
        k = merged.find(addr)
        if k < 0:
            unplaced["count"] += 1
            unplaced["bytes"] += lt.block
        else:
            out[k]["blocks"].append((addr, lt, state))
    return out, unplaced


def free_runs(segments: list) -> list[int]:
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


def live_at(tl: DeviceTimeline, point: int) -> list[Lifetime]:
    """The blocks allocated at a point of the timeline (0 = start, k = after event k-1): their
    block sizes add up to tl.allocated[point]."""
    return [lt for lt in tl.lifetimes if lt.start < point and (lt.end is None or lt.end >= point)]


def top_lifetimes(tl: DeviceTimeline, n: int) -> list[Lifetime]:
    """The n largest blocks of the trace (by block size, then earliest)."""
    return sorted(tl.lifetimes, key=lambda lt: (-lt.block, lt.start))[:max(0, n)]


def downsample(n: int, keep: int, series: list[list]) -> list[int]:
    """Indexes of at most about `keep` points that keep every series' maxima and minima per bucket."""
    if n <= keep:
        return list(range(n))
    chosen = {0, n - 1}
    bucket = -(-n // max(1, keep // (2 * len(series) + 1)))
    for lo in range(0, n, bucket):
        hi = min(n, lo + bucket)
        for values in series:
            window = range(lo, hi)
            chosen.add(max(window, key=values.__getitem__))
            chosen.add(min(window, key=values.__getitem__))
        chosen.add(hi - 1)
    return sorted(chosen)
