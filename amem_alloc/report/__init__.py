"""`amem report`: one self-contained HTML page about a memory snapshot (amem's or torch's).

    from amem_alloc.report import write_report
    write_report("trace.pickle", "report.html")

The page needs no network: its CSS, script and data are inline and its Content-Security-Policy
forbids every fetch. Per device it shows, for each out-of-memory error, a forensics panel
(report/oom.py: the request, free and reserved memory, whether fragmentation caused it, what
held memory, and which policy would have avoided it, replayed); allocated vs reserved over time;
allocated memory by call site over time (stacked); what holds memory at the peak, by call site
(snapshot/callsite.py: the user's frame or the autograd node, never the allocator's) and by tag,
category and module where the trace or a Tracer's JSON carries them (report/breakdown.py);
fragmentation over time; the segment map at the allocated peak (every segment; the smaller ones
aggregated when there are many); the largest allocations; and notes on what the trace could not
tell (see amem_alloc/timeline.py for how totals are rebuilt). An optional `provenance` dict (e.g.
amem_alloc.provenance's Tracer.to_json()) adds its own section, and its allocation rows label
the blocks with category and module (and, joined by allocation number, stack the categories over
time).
"""
from __future__ import annotations

import os
from pathlib import Path

from .. import atomic_write
from ..provenance_format import is_provenance
from ..version import __version__
from . import html as _html
from .data import report_data
from .provenance import section as provenance_section

__all__ = ["format_prediction", "render_ranks_report", "render_report", "write_prediction_report",
           "write_ranks_report", "write_report"]


def format_prediction(prediction, top: int = 8) -> str:
    """A prediction's text, what `amem predict` prints (a Prediction from amem_alloc.predict, or its JSON)."""
    from .prediction_text import format_prediction as text

    return text(prediction, top)


def write_prediction_report(prediction, path) -> Path:
    """A prediction's HTML page, what `amem predict --report` writes (anything with to_dict() and
    snapshot(): amem_alloc.predict's Prediction)."""
    from .predict import write

    return write(path, prediction.to_dict(), prediction.snapshot())


def _subtitle(source: str, data: dict) -> str:
    who = data["generator"] or ("PyTorch's caching allocator" if data["source"] == "torch" else "amem_alloc")
    n = len(data["devices"])
    return f"{source} — written by {who}; {n} device{'s' if n != 1 else ''} with data"


def _provenance_section(provenance: dict) -> str:
    """amem_alloc.provenance's own tables for its JSON; any other dict as key/value rows."""
    if is_provenance(provenance):
        return provenance_section(provenance)
    return _html.key_value_section("Provenance", "provenance", provenance)


def render_report(snapshot: dict, provenance: dict | None = None, title: str | None = None,
                  source: str = "snapshot", top: int = 20) -> str:
    """The report page for a checked snapshot (see amem_alloc.load_snapshot) as HTML text."""
    tracer_json = provenance if provenance is not None and provenance.get("allocations") else None
    data = report_data(snapshot, top=top, provenance=tracer_json)
    body = [_html.summary_section(data["devices"])] + [_html.device_section(dev) for dev in data["devices"]]
    if data["empty"]:
        body.append('<section class="empty"><h2>Nothing recorded</h2><p>The snapshot has no segments and no '
                    "trace events: there is nothing to plot. Was recording on (amem_alloc.record()) before the "
                    "dump?</p></section>")
    if provenance is not None:
        body.append(_provenance_section(provenance))
    if snapshot.get("allocator_settings"):
        body.append(_html.key_value_section("Allocator settings", "settings", snapshot["allocator_settings"]))
    title = title or f"Memory report: {Path(source).name}"
    return _html.page(title, _subtitle(source, data), "\n".join(body), data, __version__)


def write_report(trace: str | os.PathLike | dict, out: str | os.PathLike, provenance: dict | None = None,
                 title: str | None = None, top: int = 20) -> Path:
    """Loads `trace` (a path, safely; or a snapshot dict) and writes its report to `out`."""
    from ..snapshot import load_snapshot, parse_snapshot

    if isinstance(trace, dict):
        snapshot, source = parse_snapshot(trace, "<snapshot>"), "snapshot"
    else:
        snapshot, source = load_snapshot(trace), str(trace)
    if provenance is not None and not isinstance(provenance, dict):
        raise ValueError(f"amem: provenance must be a dict (e.g. Tracer.to_json()), got {type(provenance).__name__}")
    return atomic_write.write_text(out, render_report(snapshot, provenance, title, source, top))


def render_ranks_report(snapshots: list[tuple[str, dict]], title: str | None = None) -> str:
    """Several ranks' traces ((source, checked snapshot) each) on one page: see report/ranks.py."""
    from .ranks import load_ranks, rank_data, ranks_section

    data = rank_data(load_ranks(snapshots))
    title = title or f"Memory report: {len(snapshots)} ranks"
    subtitle = ", ".join(Path(source).name for source, _ in snapshots)
    return _html.page(title, subtitle, ranks_section(data), {"devices": [], "ranks": data}, __version__)


def write_ranks_report(traces: list, out: str | os.PathLike, title: str | None = None) -> Path:
    """Loads every trace (safely) and writes the side-by-side page to `out`."""
    from ..snapshot import load_snapshot

    snapshots = [(str(t), load_snapshot(t)) for t in traces]
    return atomic_write.write_text(out, render_ranks_report(snapshots, title))
