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
Within the uncertainty of the card's usable memory (the context estimate, predict/gpus.py) a
verdict is `borderline` and says so. When a policy does not fit, `next_step` says what to do:
the cheapest what-if that makes it fit (when the what-ifs ran), a policy that fits, or how to
find out (what-ifs, amem fit).

`verdict(p)` is the data (the JSON's "verdict", from which report/verdict.py draws the panel that
opens the predict report and the lines that end `amem predict`'s text).
"""
from __future__ import annotations

from typing import Any

from ...categories import GROUPS, group_of
from ...introspection import format_bytes
from ...policies import Policy


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
    figure: the smallest usable memory it runs in), whether that is within the uncertainty of the
    card's figures, its parts; and the next step when a policy does not fit."""
    g = p.gpu
    parts = parts_at_peak(p)
    uncertainty = g.context_uncertainty
    rows = []
    for r in p.rows:
        split = dict(parts)
        split["cached but free"] = max(0, r.peak_reserved - p.at_peak.allocated)
        spare = g.usable - r.min_capacity
        rows.append({"policy": r.policy, "fits": r.fits, "peak_reserved": r.peak_reserved,
                     "min_capacity": r.min_capacity, "needs": r.min_capacity, "spare": spare,
                     "headroom": r.headroom, "short_by": max(0, -spare), "borderline": abs(spare) < uncertainty,
                     "parts": split, "says": says(r, g.usable, uncertainty)})
    return {"card": g.name, "usable_bytes": g.usable, "capacity_bytes": g.total_memory, "policies": rows,
            "uncertainty_bytes": uncertainty, "uncertainty": UNCERTAINTY if uncertainty else None,
            "next_step": next_step(p, rows),
            "parts_measured_at": "the peak of allocated memory (cached but free: peak reserved less that)"}


# Why a verdict within the context estimate is borderline (predict/gpus.py: context_uncertainty).
UNCERTAINTY = ("usable memory is the card's total less an estimate of what the CUDA context and libraries "
               "hold, not measured on your card")


def says(r: Any, usable: int, uncertainty: int = 0) -> str:
    """The verdict of one policy in words: fits or not, and by how much, from the one "needs" figure."""
    spare = usable - r.min_capacity
    near = f" (borderline: within the ~{format_bytes(uncertainty)} context estimate)" if abs(spare) < uncertainty else ""
    if not r.fits:
        return f"does not fit: needs {format_bytes(r.min_capacity)}, {format_bytes(-spare)} more than usable{near}"
    if r.headroom < 0:
        return (f"fits only by emptying its cache when a cudaMalloc fails: needs {format_bytes(r.min_capacity)}, "
                f"{format_bytes(spare)} to spare; peak reserved {format_bytes(r.peak_reserved)}{near}")
    return f"fits: needs {format_bytes(r.min_capacity)}, {format_bytes(spare)} to spare{near}"


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
    """The script's batch-size argument, where its command line names one (--batch_size=12 ->
    batch_size): the argument `amem fit --arg` would search."""
    for word in script_argv(target) or []:
        name = word.split("=", 1)[0]
        if name.startswith("--") and "batch" in name.lower():
            return name[2:]
    return None
