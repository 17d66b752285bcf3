"""What holds memory at a point of the timeline, and the groups of it over time.

Design note
-----------
The blocks live at a point (timeline.live_at) are grouped by call site (snapshot/callsite.py), by tag
where the trace carries tags (amem's dumps, torch's user_metadata), and by category and module
where a Tracer's JSON (amem_alloc.provenance) describes the allocations. The Tracer's rows are
joined to the trace's blocks by amem's allocation number (`alloc_seq`, exact, in amem's dumps)
or else by address and block size among the blocks live at that point (a guess that the page
states).

Blocks live since before recording began form their own share ("live before recording"): the
trace cannot tell when they were made, only where (when their stack is known).

The stacked timeline (torch profiler's memory timeline) has one band for the blocks live before
recording, one per call site holding the most at the peak, and one for the rest; the bands add up
to the allocated line at every point. With a Tracer's JSON whose rows carry amem's allocation
numbers, a second one stacks the profiler's categories.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..snapshot.callsite import CallSites
from ..timeline import DeviceTimeline, Lifetime, live_at

TOP_GROUPS = 12        # rows per grouping in the tables
STACKED_BANDS = 10     # call sites drawn as their own band in the stacked timeline
BEFORE = "live before recording"
OTHER = "everything else"


def _grouped(items: list[tuple[str, Lifetime]], total: int, limit: int = TOP_GROUPS) -> list[dict[str, Any]]:
    groups: dict[str, dict] = {}
    for key, lt in items:
        g = groups.setdefault(key, {"key": key, "bytes": 0, "blocks": 0, "before": 0})
        g["bytes"] += lt.block
        g["blocks"] += 1
        g["before"] += lt.block if lt.live_at_start else 0
    rows = sorted(groups.values(), key=lambda g: (-g["bytes"], g["key"]))
    head, rest = rows[:limit], rows[limit:]
    if rest:
        head.append({"key": f"{len(rest)} more", "bytes": sum(g["bytes"] for g in rest),
                     "blocks": sum(g["blocks"] for g in rest), "before": sum(g["before"] for g in rest), "rest": True})
    for g in head:
        g["share"] = round(g["bytes"] / total, 4) if total else 0.0
    return head


class BlockLabels:
    """A Tracer's allocation rows, indexed to label the trace's blocks with category and module."""

    def __init__(self, provenance: dict | None):
        rows = (provenance or {}).get("allocations") or []
        rows = [r for r in rows if isinstance(r, dict)]
        self.present = bool(rows)
        self.by_seq = {r["alloc_seq"]: r for r in rows if isinstance(r.get("alloc_seq"), int)}
        self.by_addr: dict[int, list] = {}
        for r in rows:
            if isinstance(r.get("address"), int):
                self.by_addr.setdefault(r["address"], []).append(r)

    def row(self, lt: Lifetime) -> tuple[dict | None, str]:
        """(row, how): how is "seq", "address" or "" when no row describes the block."""
        if lt.alloc_seq is not None and lt.alloc_seq in self.by_seq:
            return self.by_seq[lt.alloc_seq], "seq"
        same = [r for r in self.by_addr.get(lt.addr, []) if r.get("allocator_bytes") in (lt.block, None)]
        return (same[-1], "address") if len(same) == 1 else (None, "")


def _module(row: dict) -> str:
    module = row.get("module")
    return "(outside the model)" if module is None else (module or "(model)")


def held_at(tl: DeviceTimeline, point: int, sites: CallSites, prov: BlockLabels | None = None) -> dict[str, Any]:
    """What the blocks live at `point` are: totals, the share live before recording, and groups."""
    live = live_at(tl, point)
    total = sum(lt.block for lt in live)
    before = sum(lt.block for lt in live if lt.live_at_start)
    out: dict[str, Any] = {"point": point, "t": tl.times[point] if tl.times else 0, "bytes": total,
                           "blocks": len(live), "before": before,
                           "before_share": round(before / total, 4) if total else 0.0,
                           "by_site": _grouped([(sites(lt.frames), lt) for lt in live], total)}
    if any(lt.tag for lt in live):
        out["by_tag"] = _grouped([(lt.tag or "(untagged)", lt) for lt in live], total)
    if prov is not None and prov.present:
        joined = [(lt, *prov.row(lt)) for lt in live]
        out["by_category"] = _grouped([(str(r.get("category") or "uncategorized") if r else "(not traced)", lt)
                                       for lt, r, _ in joined], total)
        out["by_module"] = _grouped([(_module(r) if r else "(not traced)", lt) for lt, r, _ in joined], total)
        out["joined"] = {"seq": sum(h == "seq" for _, _, h in joined), "address": sum(h == "address" for _, _, h in joined),
                         "none": sum(h == "" for _, _, h in joined)}
    return out


def stacked(tl: DeviceTimeline, keep: list[int], peak: int, key: Callable[[Lifetime], str],
            split_before: bool = True) -> dict[str, Any]:
    """Bands of allocated bytes at the points `keep`: the blocks live before recording (when
    split_before), the groups (key) holding the most at `peak`, and everything else. The bands add
    up to tl.allocated at every kept point."""
    at_peak: dict[str, int] = {}
    for lt in live_at(tl, peak):
        if not (split_before and lt.live_at_start):
            at_peak[key(lt)] = at_peak.get(key(lt), 0) + lt.block
    top = [k for k, _ in sorted(at_peak.items(), key=lambda kv: (-kv[1], kv[0]))[:STACKED_BANDS]]
    names = [BEFORE] + top + [OTHER]
    index = {name: i for i, name in enumerate(names)}
    n = len(tl.allocated)
    deltas = np.zeros((len(names), n + 1), dtype=np.int64)
    for lt in tl.lifetimes:
        band = 0 if split_before and lt.live_at_start else index.get(key(lt), len(names) - 1)
        deltas[band, lt.start + 1 if lt.start >= 0 else 0] += lt.block
        if lt.end is not None:
            deltas[band, lt.end + 1] -= lt.block
    values = np.cumsum(deltas[:, :n], axis=1)[:, keep]
    bands = [{"name": name, "kind": "before" if i == 0 else "other" if i == len(names) - 1 else "site",
              "values": values[i].tolist()} for i, name in enumerate(names) if values[i].any()]
    return {"bands": bands}


def by_call_site(sites: CallSites) -> Callable[[Lifetime], str]:
    return lambda lt: sites(lt.frames)


def by_category(prov: BlockLabels) -> Callable[[Lifetime], str]:
    """A block's category from the Tracer's rows, joined by allocation number only: an address
    join is only sound for the blocks live at one point, not over the whole timeline."""
    def key(lt: Lifetime) -> str:
        row = prov.by_seq.get(lt.alloc_seq) if lt.alloc_seq is not None else None
        return str(row.get("category") or "uncategorized") if row else "(not traced)"
    return key
