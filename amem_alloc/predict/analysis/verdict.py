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

One figure answers "how much does it need": `needs`, the smallest usable memory the run fits in
(the min capacity: torch empties its cache and retries before it fails); `spare` is usable less
that, negative when it does not fit. The table, the verdict and amem fit say the same figure.

The device total is what nvidia-smi lists for the process: the policy's peak reserved memory plus
what the process holds outside the caching allocator (the CUDA context and the libraries, line by
line: predict/context.py). The verdict is taken on it: usable memory is the card's total memory
(torch's `total_memory`) less that part, so a policy fits when its smallest capacity plus that
part is within the card's total, and `spare` is the card's total less that sum. A fit or a miss
within the device total's uncertainty (that part's own, plus ALLOCATOR_SHARE of the peak reserved
for the allocator's replay) is `borderline` and says so. When a policy does not fit, `next_step`
says what to do: the cheapest what-if that makes it fit (when the what-ifs ran), a policy that
fits, or how to find out (what-ifs, amem fit).

`verdict(p)` is the data (the JSON's "verdict", from which report/verdict.py draws the panel that
opens the predict report and the lines that end `amem predict`'s text).
"""
from __future__ import annotations

import re
from typing import Any

from ...categories import GROUPS, group_of
from ...introspection import format_bytes
from ...policies import Policy
from .. import batch_search
from . import growth

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
    """The verdict of an outcome.Prediction, JSON-able: per policy, fits, by how much (one "needs"
    figure: the smallest usable memory it runs in), its device total and whether the answer is
    within that total's uncertainty, its parts; and the next step when a policy does not fit."""
    g = p.gpu
    outside = getattr(p, "outside", None)
    held, spread = (outside.total, outside.uncertainty) if outside is not None else (g.context, 0)
    parts = parts_at_peak(p)
    over = getattr(p, "over_run", None)
    grows = growth.per_step(p.ops, p.infos, over.at_markers, getattr(p, "script_folder", None)) if over else None
    rows = []
    for r in p.rows:
        split = dict(parts)
        split["cached but free"] = max(0, r.peak_reserved - p.at_peak.allocated)
        spare = g.usable - r.min_capacity
        total = DeviceTotal(r.peak_reserved + held, r.min_capacity + held, g.total_memory,
                            spread + int(ALLOCATOR_SHARE * r.peak_reserved))
        rows.append({"policy": r.policy, "fits": r.fits, "peak_reserved": r.peak_reserved,
                     "min_capacity": r.min_capacity, "needs": r.min_capacity, "spare": spare,
                     "headroom": r.headroom, "short_by": max(0, -spare),
                     "device_total": total.at_peak, "device_total_needed": total.needed,
                     "uncertainty": total.uncertainty, "borderline": total.borderline,
                     "parts": split, "says": says(r, g.usable, total.uncertainty, total if held else None),
                     "steps_left": growth.steps_left(grows, spare)})
    return {"card": g.name, "usable_bytes": g.usable, "capacity_bytes": g.total_memory, "policies": rows,
            "outside_allocator": outside.to_dict() if outside is not None else None,
            "uncertainty_bytes": spread, "uncertainty": uncertainty_reason(spread),
            "next_step": next_step(p, rows), "growth": grows, "batch_search": batch_search.said(getattr(p, "notes", None)),
            "parts_measured_at": "the peak of allocated memory (cached but free: peak reserved less that)"}


class DeviceTotal:
    """One policy's device total: at its peak, what it needs at least (its smallest capacity plus
    what the process holds outside the allocator), against the card's total, and how sure."""

    def __init__(self, at_peak: int, needed: int, card: int, uncertainty: int) -> None:
        self.at_peak, self.needed, self.card, self.uncertainty = at_peak, needed, card, uncertainty

    @property
    def borderline(self) -> bool:
        return abs(self.card - self.needed) <= self.uncertainty


def uncertainty_reason(outside: int) -> str:
    """Why a verdict within the device total's uncertainty is borderline (the text's line above the bars)."""
    held = (f"what the process holds outside the caching allocator is modelled, ±{format_bytes(outside)}, "
            "not measured on your card; ") if outside else ""
    return held + f"the allocator's replay is held to {ALLOCATOR_SHARE:.0%} of the peak reserved"


def says(r: Any, usable: int, uncertainty: int = 0, total: DeviceTotal | None = None) -> str:
    """The verdict of one policy in words: fits or not, and by how much, from the one "needs" figure;
    with its device total (given where the process holds anything outside the allocator, else it is
    the peak reserved), that too; "borderline" where the spare is within `uncertainty`."""
    spare = usable - r.min_capacity
    near = f" (borderline: within the ±{format_bytes(uncertainty)} uncertainty)" if abs(spare) <= uncertainty else ""
    tail = (f"; device total {format_bytes(total.at_peak)} of {format_bytes(total.card)}" if total is not None
            else "") + near
    if not r.fits:
        return f"does not fit: needs {format_bytes(r.min_capacity)}, {format_bytes(-spare)} more than usable{tail}"
    if r.headroom < 0:
        return (f"fits only by emptying its cache when a cudaMalloc fails: needs {format_bytes(r.min_capacity)}, "
                f"{format_bytes(spare)} to spare; peak reserved {format_bytes(r.peak_reserved)}{tail}")
    return f"fits: needs {format_bytes(r.min_capacity)}, {format_bytes(spare)} to spare{tail}"


# ============================================================================ the next step
def next_step(p: Any, rows: list[dict]) -> dict | None:
    """What to do when a policy does not fit (None when every one fits), as data:

    * "what_if": the what-ifs ran and one makes a policy fit: the cheapest such change;
    * "policy": another policy fits: the one with most to spare (how to use it is report/'s to say);
    * "explore": find out: `amem predict --what-if all`, `amem fit --arg ...` on the script.
    """
    failing = [r["policy"] for r in rows if not r["fits"]]
    if not failing:
        return None
    base = {"failing": failing, "script": script_argv(p.target), "batch_arg": batch_argument(p.target)}
    picks = (getattr(p, "what_if_json", None) or {}).get("cheapest_change") or {}
    change = next(((pol, ch) for pol, ch in picks.items() if ch), None)
    if change is not None:
        return dict(base, kind="what_if", policy=change[0], change=change[1],
                    tried=bool(picks), none_fits=[pol for pol, ch in picks.items() if ch is None])
    fitting = sorted((r for r in rows if r["fits"]), key=lambda r: -r["spare"])
    if fitting:
        row = next(x for x in p.rows if x.policy == fitting[0]["policy"])
        return dict(base, kind="policy", policy=row.policy, conf=row.conf, native=_native(row.policy),
                    tried=bool(picks))
    return dict(base, kind="explore", tried=bool(picks))


def _native(name: str) -> bool:
    return Policy(name, "", "").native


def script_argv(target: str) -> list[str] | None:
    """The predicted script's command line from the prediction's target ("script train.py --x 1"),
    None for a workload or a function."""
    parts = target.split()
    return parts[1:] if len(parts) >= 2 and parts[0] == "script" and parts[1].endswith(".py") else None


def batch_argument(target: str) -> str | None:
    """The script's batch-size argument, the long name `amem fit --arg` would search: where its
    command line names one (--batch_size=12 -> batch_size); else from the script's own argparse
    calls, the long option given beside a short one its command line used (timm's and torchvision's
    `-b 256`: `add_argument("-b", "--batch-size", ...)` -> batch-size), or its one batch option
    that is not an evaluation's; None where neither says."""
    argv = script_argv(target) or []
    for word in argv:
        name = word.split("=", 1)[0]
        if name.startswith("--") and "batch" in name.lower():
            return name[2:]
    declared = _batch_options(argv[0]) if argv else []
    used = {w.split("=", 1)[0] for w in argv[1:] if w.startswith("-") and not w.startswith("--")}
    beside = [long for shorts, long in declared if shorts & used]
    alone = [long for _, long in declared if not _EVALUATION.search(long)]
    if len(beside) == 1:
        return beside[0]
    return alone[0] if not beside and len(alone) == 1 else None


_ADD_ARGUMENT = re.compile(r"add_argument\(\s*((?:['\"][^'\"]*['\"]\s*,\s*)*['\"][^'\"]*['\"])")
_EVALUATION = re.compile(r"val|eval|test|infer|predict", re.I)


def _batch_options(script: str) -> list[tuple[set[str], str]]:
    """(short options, long name) of each `add_argument` in the script's file with a long option
    naming a batch."""
    try:
        text = open(script, encoding="utf-8", errors="replace").read()
    except OSError:
        return []
    out = []
    for call in _ADD_ARGUMENT.finditer(text):
        names = re.findall(r"['\"]([^'\"]*)['\"]", call.group(1))
        longs = [n[2:] for n in names if n.startswith("--") and "batch" in n.lower()]
        if longs:
            out.append(({n for n in names if n.startswith("-") and not n.startswith("--")}, longs[0]))
    return out
