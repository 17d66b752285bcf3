"""Several ranks side by side: `amem report trace.rank0.pickle trace.rank1.pickle ...`.

Design note
-----------
Under torchrun each rank writes its own trace (AMEM_TRACE, recording.rank_path). This page puts
them next to each other: per rank the peak allocated and peak reserved (the highest over the
rank's devices), the skew between ranks (largest / smallest peak, and the gap in bytes), and the
memory timelines of every rank on one time axis. Totals come from amem_alloc/timeline.py, exactly as
the one-trace report rebuilds them.

Aligning: where every trace has timestamps and their recordings overlap in time, the axis is
wall-clock time since the earliest first event of any rank (ranks of one job share a clock
closely enough for a memory plot); timestamps that do not overlap (traces of separate runs)
are each drawn from their own start; without timestamps the axis is each rank's event index.
The page says which. The plot is inline SVG (report/line_chart.py), so the page needs no script
for it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..introspection import format_bytes
from . import line_chart
from .data import devices_with_data
from .html import esc
from ..timeline import DeviceTimeline, build_timeline, downsample

MAX_POINTS = 600  # per rank and series in the SVG (report/line_chart.py draws it)


@dataclass
class Rank:
    label: str
    source: str
    timelines: list[DeviceTimeline] = field(default_factory=list)

    @property
    def peak_allocated(self) -> int:
        return max((max(tl.allocated, default=0) for tl in self.timelines), default=0)

    @property
    def peak_reserved(self) -> int:
        return max((max(tl.reserved, default=0) for tl in self.timelines), default=0)

    @property
    def timed(self) -> bool:
        return bool(self.timelines) and all(tl.time_unit == "us" for tl in self.timelines)


def rank_label(snapshot: dict, source: str, index: int) -> str:
    """The rank a trace came from: amem's own record of it, else `rank<N>` in the file name."""
    rank = (snapshot.get("amem") or {}).get("rank")
    if isinstance(rank, int) and not isinstance(rank, bool):
        return f"rank {rank}"
    found = re.search(r"rank[_-]?(\d+)", Path(source).name)
    return f"rank {int(found.group(1))}" if found else f"trace {index}"


def load_ranks(snapshots: list[tuple[str, dict]]) -> list[Rank]:
    """(source, checked snapshot) per file -> one Rank each, in rank order."""
    ranks = []
    for i, (source, snapshot) in enumerate(snapshots):
        rank = Rank(rank_label(snapshot, source, i), source)
        rank.timelines = [build_timeline(snapshot, d) for d in devices_with_data(snapshot)]
        ranks.append(rank)
    key = lambda r: (0, int(r.label.split()[-1])) if r.label.startswith("rank ") else (1, r.label)  # noqa: E731
    return sorted(ranks, key=key)


def skew(values: list[int]) -> dict:
    """How far apart the ranks are: largest / smallest, and the gap in bytes."""
    if not values:
        return {"ratio": None, "gap": 0}
    lo, hi = min(values), max(values)
    return {"ratio": hi / lo if lo > 0 else None, "gap": hi - lo}


def _overlap(ranks: list[Rank]) -> bool:
    """Whether the ranks' recordings share some stretch of wall-clock time (those of one job do)."""
    spans = [(tl.start_time_us, tl.start_time_us + (tl.times[-1] if tl.times else 0))
             for r in ranks for tl in r.timelines]
    return bool(spans) and max(s for s, _ in spans) <= min(e for _, e in spans)


def rank_data(ranks: list[Rank]) -> dict:
    """Per rank peaks, the skew, and the aligned series (JSON-able)."""
    timed = all(r.timed for r in ranks)
    shared_clock = timed and _overlap(ranks)
    t0 = min((tl.start_time_us for r in ranks for tl in r.timelines), default=0) if timed else 0
    rows = []
    for r in ranks:
        series = []
        for tl in r.timelines:
            keep = downsample(len(tl.times), MAX_POINTS, [tl.allocated, tl.reserved])
            shift = (tl.start_time_us - t0) if shared_clock else 0
            series.append({"device": tl.device, "t": [tl.times[k] + shift for k in keep],
                           "allocated": [tl.allocated[k] for k in keep], "reserved": [tl.reserved[k] for k in keep]})
        rows.append({"label": r.label, "source": r.source, "peak_allocated": r.peak_allocated,
                     "peak_reserved": r.peak_reserved, "devices": [tl.device for tl in r.timelines],
                     "series": series})
    return {"ranks": rows, "axis": ("us" if shared_clock else "us from each start") if timed else "event",
            "skew": {"allocated": skew([r["peak_allocated"] for r in rows]),
                     "reserved": skew([r["peak_reserved"] for r in rows])}}


# ---------------------------------------------------------------------------- HTML
def _skew_text(s: dict) -> str:
    ratio = f"{s['ratio']:.2f}x" if s["ratio"] is not None else "n/a"
    return f"{ratio} (gap {format_bytes(s['gap'])})"


def _table(data: dict) -> str:
    rows = "".join(
        f"<tr><td>{esc(r['label'])}</td><td>{esc(Path(r['source']).name)}</td>"
        f"<td class='n' title='{r['peak_allocated']} bytes'>{esc(format_bytes(r['peak_allocated']))}</td>"
        f"<td class='n' title='{r['peak_reserved']} bytes'>{esc(format_bytes(r['peak_reserved']))}</td>"
        f"<td>{esc(', '.join(map(str, r['devices'])) or 'none')}</td></tr>" for r in data["ranks"])
    sk = data["skew"]
    return ("<table class='ranks'><thead><tr><th>rank</th><th>file</th><th>peak allocated</th><th>peak reserved</th>"
            f"<th>devices</th></tr></thead><tbody>{rows}</tbody></table>"
            f"<p class='skew'>Skew across ranks (largest / smallest peak): allocated {esc(_skew_text(sk['allocated']))}, "
            f"reserved {esc(_skew_text(sk['reserved']))}.</p>")


def _svg(data: dict) -> str:
    series = [(f"{r['label']}, device {s['device']}", s) for r in data["ranks"] for s in r["series"]]
    lines = []
    for i, (name, s) in enumerate(series):
        lines.append(line_chart.Line(f"{name}: reserved", line_chart.colour(i), s["t"], s["reserved"]))
        lines.append(line_chart.Line(f"{name}: allocated", line_chart.colour(i), s["t"], s["allocated"], dashed=True))
    unit = {"us": "time since the first event of any rank (ms)",
            "us from each start": "time since each trace's own first event (ms): the traces do not overlap in "
                                  "time, so they are not from one job's ranks running together",
            "event": "event index (no timestamps)"}[data["axis"]]
    t_max = max((s["t"][-1] for _, s in series if s["t"]), default=1) or 1
    end = f"{t_max / 1000:.1f} ms" if data["axis"] != "event" else f"{t_max:.0f}"
    return (line_chart.chart(lines, end, "ranks-plot", "memory per rank over time")
            + f"<p class='legend'>{line_chart.legend([name for name, _ in series])}<br>solid: reserved, dashed: "
            f"allocated; x axis: {esc(unit)}</p>")


def ranks_section(data: dict) -> str:
    """The <section> comparing the ranks."""
    n = len(data["ranks"])
    return (f"<section class='ranks' id='ranks'><h2>{n} ranks side by side</h2>{_table(data)}{_svg(data)}"
            "<p>Each rank's full report (segments, largest allocations, stacks): <code>amem report FILE</code> "
            "with that rank's file.</p></section>")
