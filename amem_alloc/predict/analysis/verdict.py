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

The device total is what nvidia-smi lists for the process: the policy's peak reserved memory plus
what the process holds outside the caching allocator (the CUDA context and the libraries, line by
line: predict/context.py). The verdict is taken on it: a policy fits when its smallest capacity
plus that part is within the card's total memory (torch's `total_memory`), its headroom is the
card's total less its device total. A fit or a miss within the estimate's uncertainty (that part's
own, plus ALLOCATOR_SHARE of the peak reserved for the allocator's replay) is borderline.

`verdict(p)` is the data (the JSON's "verdict", from which report/verdict.py draws the panel that
opens the predict report and the lines that open `amem predict`'s text).
"""
from __future__ import annotations

from typing import Any

from ...categories import GROUPS, group_of
from ...introspection import format_bytes

# The allocator's share of the uncertainty: 2% of the peak reserved, the target the predicted
# device totals were held to on the H200 (benchmarks/RESULTS.md, "On a GPU: NVIDIA H200")
ALLOCATOR_SHARE = 0.02


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
    """The verdict of an outcome.Prediction, JSON-able: per policy, fits, by how much, its parts and
    its device total."""
    g = p.gpu
    outside = getattr(p, "outside", None)
    held, spread = (outside.total, outside.uncertainty) if outside is not None else (g.context, 0)
    parts = parts_at_peak(p)
    rows = []
    for r in p.rows:
        split = dict(parts)
        split["cached but free"] = max(0, r.peak_reserved - p.at_peak.allocated)
        short = r.min_capacity - g.usable
        total = DeviceTotal(r.peak_reserved + held, r.min_capacity + held, g.total_memory,
                            spread + int(ALLOCATOR_SHARE * r.peak_reserved))
        rows.append({"policy": r.policy, "fits": r.fits, "peak_reserved": r.peak_reserved,
                     "min_capacity": r.min_capacity, "headroom": r.headroom, "short_by": max(0, short),
                     "device_total": total.at_peak, "device_total_needed": total.needed,
                     "uncertainty": total.uncertainty, "borderline": total.borderline,
                     "parts": split, "says": says(r, g.usable, total)})
    return {"card": g.name, "usable_bytes": g.usable, "capacity_bytes": g.total_memory, "policies": rows,
            "outside_allocator": outside.to_dict() if outside is not None else None,
            "parts_measured_at": "the peak of allocated memory (cached but free: peak reserved less that)"}


class DeviceTotal:
    """One policy's device total: at its peak, what it needs at least (its smallest capacity plus
    what the process holds outside the allocator), against the card's total, and how sure."""

    def __init__(self, at_peak: int, needed: int, card: int, uncertainty: int) -> None:
        self.at_peak, self.needed, self.card, self.uncertainty = at_peak, needed, card, uncertainty

    @property
    def borderline(self) -> bool:
        return abs(self.card - self.needed) <= self.uncertainty

    def words(self) -> str:
        near = f", within the estimate's ±{format_bytes(self.uncertainty)}" if self.borderline else ""
        return f" (device total {format_bytes(self.at_peak)} of {format_bytes(self.card)}{near})"


def says(r: Any, usable: int, total: DeviceTotal | None = None) -> str:
    """What the verdict says of a policy's row; with its device total, that too, and "borderline"
    first where the total it needs is within the estimate's uncertainty of the card's."""
    head, tail = ("borderline: " if total.borderline else "", total.words()) if total is not None else ("", "")
    if not r.fits:
        return head + f"does not fit: needs {format_bytes(r.min_capacity)}, " \
                      f"{format_bytes(r.min_capacity - usable)} more than usable" + tail
    if r.headroom < 0:
        return head + (f"fits only by emptying its cache when a cudaMalloc fails (needs {format_bytes(r.min_capacity)}; "
                       f"peak reserved {format_bytes(r.peak_reserved)})") + tail
    return head + f"fits, {format_bytes(r.headroom)} to spare" + tail
