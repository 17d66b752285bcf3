"""What-ifs: the same code predicted again with one change applied by amem (changes.py), each
change's figures per policy against the unchanged run, and the cheapest change that makes it fit.

Design note
-----------
whatif/run.py's run_all re-predicts the code once per change (trial.predict, the change active around
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

from ...near_names import did_you_mean


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
            raise ValueError(f"unknown what-if {n!r}{did_you_mean(n, NAMES)}; choose from {', '.join(NAMES)} "
                             "(comma-separated, or 'all')")
    if not names:
        raise ValueError(f"--what-if needs one or more of {', '.join(NAMES)}")
    return list(dict.fromkeys(names))


def to_json(base: Any) -> dict:
    results = getattr(base, "what_if", None) or []
    if not results:
        return {}
    return {"what_if": [w.to_dict(base.rows) for w in results], "cheapest_change": cheapest(base, results)}
