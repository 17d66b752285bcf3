"""What-ifs: the same code predicted again with one change applied by amem (changes.py), each
change's figures per policy against the unchanged run, and the cheapest change that makes it fit.

Design note
-----------
whatif_run.run_all re-predicts the code once per change (trial.predict, the change active around
the code) and attaches the answers, WhatIf here, to the unchanged Prediction (`.what_if`), so that
its text, JSON and report carry them. Nothing here estimates: every figure is a re-prediction's
replay. cli/predict_whatif.py holds `amem predict --what-if`'s options.

"Cheapest" orders the changes by what they cost at run time: the ones that cost no compute first
(zeroing to None, the optimizer's implementation: a fused or foreach optimizer is faster than a
for-loop one, but none of them recomputes anything), then checkpointing by its recompute FLOPs
(the recomputed ops counted in backward, against the forward's: backward taken as twice the
forward, the usual rule for dense layers).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...introspection import format_bytes
from ...replay.evaluation import align, signed_bytes

# the changes, cheapest first where they cost nothing (changes.py applies them; torch loads with it)
NAMES = ("grads=set-to-none", "optimizer=fused", "optimizer=for-loop", "checkpoint=blocks", "checkpoint=sqrt")


@dataclass
class WhatIf:
    change: str
    rows: list = field(default_factory=list)       # replay/evaluation.PolicyRow per policy; empty when it failed
    notes: list[str] = field(default_factory=list)
    failed: str | None = None                       # one line: why the changed run could not be predicted
    applied: int = 0
    recompute_flops: int = 0                        # checkpointing: the recomputed ops' FLOPs over the run
    forward_flops: int = 0                          # checkpointing: the model's forward FLOPs over the run
    stack: str | None = None                        # checkpointing: the block stack, its blocks and segment
    blocks: int = 0
    segment: int = 0
    costs_compute: bool = False
    at_peak: dict = field(default_factory=dict)     # category -> bytes live at the changed run's peak

    @property
    def recompute_share(self) -> float | None:
        """Recompute as a share of the unchanged step's compute (forward + backward ~ 3 x forward)."""
        if not self.costs_compute or not self.forward_flops:
            return None
        return self.recompute_flops / (3 * self.forward_flops)

    def row(self, policy: str) -> Any:
        return next((r for r in self.rows if r.policy == policy), None)

    def cost_key(self) -> tuple:
        return (self.costs_compute, self.recompute_flops, NAMES.index(self.change))

    def to_dict(self, base_rows: list) -> dict:
        base = {r.policy: r for r in base_rows}
        policies = [{"policy": r.policy, "peak_allocated": r.peak_allocated, "peak_reserved": r.peak_reserved,
                     "min_capacity": r.min_capacity, "fits": r.fits, "headroom": r.headroom,
                     "saving_allocated": base[r.policy].peak_allocated - r.peak_allocated,
                     "saving_reserved": base[r.policy].peak_reserved - r.peak_reserved} for r in self.rows]
        out = {"change": self.change, "policies": policies, "notes": self.notes, "failed": self.failed,
               "applied": self.applied, "at_peak": self.at_peak}
        if self.costs_compute:
            out["recompute"] = {"flops": self.recompute_flops, "forward_flops": self.forward_flops,
                                "share_of_step": self.recompute_share, "stack": self.stack,
                                "blocks": self.blocks, "blocks_per_segment": self.segment}
        return out


def cheapest(base: Any, results: list[WhatIf]) -> dict[str, str | None]:
    """Per policy: the cheapest change that makes a run that does not fit fit (None: none does);
    policies where the unchanged run fits are left out."""
    out: dict[str, str | None] = {}
    ranked = sorted((w for w in results if w.rows and w.applied), key=WhatIf.cost_key)
    for r in base.rows:
        if not r.fits:
            out[r.policy] = next((w.change for w in ranked if w.row(r.policy) and w.row(r.policy).fits), None)
    return out


def parse(spec: Any) -> list[str]:
    """'checkpoint=blocks,optimizer=fused' / 'all' / a list -> the names, checked, in the given order."""
    items = spec.split(",") if isinstance(spec, str) else list(spec or [])
    names = [str(s).strip() for s in items if str(s).strip()]
    if names == ["all"]:
        return list(NAMES)
    for n in names:
        if n not in NAMES:
            raise ValueError(f"unknown what-if {n!r}; choose from {', '.join(NAMES)} (comma-separated, or 'all')")
    if not names:
        raise ValueError(f"--what-if needs one or more of {', '.join(NAMES)}")
    return list(dict.fromkeys(names))


# ============================================================================ text
def _flops(n: float) -> str:
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n / 1e6:.1f} MFLOP"


def cost_text(w: WhatIf) -> str:
    if not w.costs_compute:
        return "no recompute"
    share = w.recompute_share
    stack = f"{w.blocks} blocks of {w.stack}" + (f" in segments of {w.segment}" if w.segment > 1 else "")
    pct = f", about +{share:.0%} of the step's compute (backward taken as 2x forward)" if share is not None else ""
    return f"recomputes up to {_flops(w.recompute_flops)} over the predicted run ({stack}){pct}"


def format_text(base: Any, results: list[WhatIf]) -> list[str]:
    """The what-if lines of `amem predict`'s text."""
    if not results:
        return []
    lines = ["", "What if (each change applied by amem and the code predicted again; saving against the "
                 "unchanged run):"]
    body = []
    for w in results:
        if w.failed:
            body.append([w.change, "-", "-", "-", "-", "could not be predicted"])
            continue
        for r in w.rows:
            b = base.row(r.policy)
            body.append([w.change, r.policy, format_bytes(r.peak_allocated), format_bytes(r.peak_reserved),
                         "yes" if r.fits else "NO", signed_bytes(b.peak_reserved - r.peak_reserved)])
    headers = ["change", "policy", "peak allocated", "peak reserved", "fits", "saving (reserved)"]
    lines += ["  " + ln for ln in align([headers] + body)]
    for w in results:
        extra = ([w.failed] if w.failed else []) + w.notes + ([cost_text(w)] if w.costs_compute and w.applied else [])
        lines += [f"  {w.change}: {e}" for e in extra]
    picks = cheapest(base, results)
    for policy, change in picks.items():
        if change is None:
            lines.append(f"  {policy}: none of these changes makes it fit")
        else:
            w = next(x for x in results if x.change == change)
            lines.append(f"  cheapest change that makes it fit under {policy}: {change} ({cost_text(w)})")
    if not picks:
        lines.append("  the unchanged run fits under every policy")
    return lines


def to_json(base: Any) -> dict:
    results = getattr(base, "what_if", None) or []
    if not results:
        return {}
    return {"what_if": [w.to_dict(base.rows) for w in results], "cheapest_change": cheapest(base, results)}
