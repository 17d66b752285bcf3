"""The verdict's data and text: does the predicted run fit the card, by how much, and what fills it.

Design note
-----------
For each policy, the peak reserved memory against the card's usable memory, split into what the
storages live at the peak of allocated memory are (the Tracer's categories, grouped as
amem_alloc/categories.py's GROUPS say: parameters, gradients, optimizer state, activations,
autocast copies, temporaries, workspaces) and what the policy reserved beyond them (cached but free:
fragmentation and the cache). Those parts are measured at the peak of allocated memory, the same
for every policy; the policy's peak reserved may come at another moment, so "cached but free" is
peak reserved less allocated at that peak (never below 0). Autocast copies are the storages that
autocast's casts made (predict/engine/autocast.py notes each cast it makes); the rest of a category is as
the Tracer says.

`verdict(p)` is the data (the JSON's "verdict", from which report/verdict.py draws the panel that
opens the predict report and the lines that open `amem predict`'s text).
"""
from __future__ import annotations

from typing import Any

from ...categories import GROUPS, group_of
from ...introspection import format_bytes


def parts_at_peak(p: Any) -> dict[str, int]:
    """Bytes live at the peak of allocated memory per group (cached but free left out)."""
    out = {label: 0 for label, _ in GROUPS if label != "cached but free"}
    autocast = getattr(p, "autocast_keys", frozenset())
    for key, n in (p.at_peak.live or {}).items():
        if key in autocast:
            out["autocast copies"] += n
        else:
            info = p.infos.get(key)
            out[group_of(getattr(info, "category", None) or "unknown")] += n
    return out


def verdict(p: Any) -> dict:
    """The verdict of an outcome.Prediction, JSON-able: per policy, fits, by how much, and its parts."""
    g = p.gpu
    parts = parts_at_peak(p)
    rows = []
    for r in p.rows:
        split = dict(parts)
        split["cached but free"] = max(0, r.peak_reserved - p.at_peak.allocated)
        short = r.min_capacity - g.usable
        rows.append({"policy": r.policy, "fits": r.fits, "peak_reserved": r.peak_reserved,
                     "min_capacity": r.min_capacity, "headroom": r.headroom, "short_by": max(0, short),
                     "parts": split, "says": says(r, g.usable)})
    return {"card": g.name, "usable_bytes": g.usable, "capacity_bytes": g.total_memory, "policies": rows,
            "parts_measured_at": "the peak of allocated memory (cached but free: peak reserved less that)"}


def says(r: Any, usable: int) -> str:
    if not r.fits:
        return f"does not fit: needs {format_bytes(r.min_capacity)}, {format_bytes(r.min_capacity - usable)} more " \
               "than usable"
    if r.headroom < 0:
        return (f"fits only by emptying its cache when a cudaMalloc fails (needs {format_bytes(r.min_capacity)}; "
                f"peak reserved {format_bytes(r.peak_reserved)})")
    return f"fits, {format_bytes(r.headroom)} to spare"
