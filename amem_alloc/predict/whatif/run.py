"""Running what-ifs: the code predicted again once per change (changes.py), each answer a
whatif.WhatIf attached to the unchanged Prediction.

The caller passes `predicting` (api.predicting), so that api.predict(..., what_if=...) can use this
module without a cycle between them.
"""
from __future__ import annotations

from typing import Any, Callable

from . import answers
from . import changes as changes_mod
from . import trial
from .answers import WhatIf


def _result(change: Any, prediction: Any) -> WhatIf:
    w = WhatIf(change.name, list(prediction.rows), list(change.notes), None, change.applied,
               costs_compute=change.costs_compute, at_peak=dict(prediction.at_peak.categories))
    if isinstance(change, changes_mod.Checkpoint):
        w.recompute_flops, w.forward_flops = change.flops["recompute"], change.flops["forward"]
        w.stack, w.blocks, w.segment = change.stack, change.blocks, change.segment
    return w


def run_one(name: str, body: Callable[[Any], None], base: Any, predicting: Any, *, blocks: str | None = None,
            strict: bool = False, policies: list | None = None, shapes: str = "expected") -> WhatIf:
    change = changes_mod.make(name, blocks)
    try:
        prediction = trial.predict(body, predicting, base.gpu, policies or _policies(base), base.target,
                                   strict=strict, change=change, shapes=shapes)
    except trial.TrialFailed as failed:
        return WhatIf(name, failed=str(failed), costs_compute=change.costs_compute)
    return _result(change, prediction)


def _policies(base: Any) -> list:
    from ... import policies as policies_mod

    return [policies_mod.Policy(r.policy, r.conf, r.description) for r in base.rows]


def run_all(names: list[str], body: Callable[[Any], None], base: Any, predicting: Any, *, blocks: str | None = None,
            strict: bool = False, policies: list | None = None,
            progress: Callable[[str], None] | None = None, shapes: str = "expected") -> list[WhatIf]:
    """Each change re-predicted; the list is also set as base.what_if."""
    out = []
    for name in names:
        if progress:
            progress(f"what-if {name}: predicting again with the change applied...")
        out.append(run_one(name, body, base, predicting, blocks=blocks, strict=strict, policies=policies,
                           shapes=shapes))
    base.what_if = out
    base.what_if_json = answers.to_json(base)   # what the JSON, text and report show
    return out
