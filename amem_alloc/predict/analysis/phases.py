"""What the predicted program was doing, call by call: its phases (setup, train, eval, optimizer)
and its steps, numbered as `amem predict` numbers allocator calls ("after allocator call N": op
N - 1 of the program), for the report's time axis.

Design note
-----------
An allocation's phase is the engine's (AllocInfo.phase: forward, backward, optimizer, other) with
its grad mode: a model's forward with grad on, and backward, is train; a model's forward with grad
off (no_grad, inference_mode: an eval loop) is eval; inside optimizer.step, optimizer. What runs
outside any model's forward (a batch moved to the card, the loss) belongs to the phase that follows
it; before the first phase, it is setup (the model built and moved). Each phase is one span of
calls [first, last]; the spans cover every call of the program, in order.
"""
from __future__ import annotations

from typing import Any

from ... import replay

PHASES = ("setup", "train", "eval", "optimizer")


def phase_of(info: Any) -> str | None:
    """train, eval or optimizer; None for work outside a model's forward (it takes the next phase)."""
    phase = getattr(info, "phase", "") or ""
    if phase == "optimizer":
        return "optimizer"
    if phase == "backward":
        return "train"
    if phase == "forward" and getattr(info, "module", None):
        return "train" if getattr(info, "grad", True) else "eval"
    return None


def spans(ops: list[tuple], infos: dict[int, Any]) -> list[list]:
    """[[first call, last call, phase]] covering calls 1..len(ops), one per run of a phase."""
    out: list[list] = []
    gap = None   # first call of the allocations outside any phase since the last one in a phase
    for i, (kind, key, _, _) in enumerate(ops):
        label = phase_of(infos.get(key)) if kind == replay.ALLOC else None
        if label is None:
            gap = i + 1 if gap is None and kind == replay.ALLOC else gap
            continue
        start, gap = (gap or i + 1) if out else i + 1, None   # before the first phase: setup
        if out and out[-1][2] == label:
            continue
        if not out and start > 1:
            out.append([1, start - 1, "setup"])
        if out:
            out[-1][1] = start - 1
        out.append([start, start, label])
    if not out:
        return [[1, len(ops), "setup"]] if ops else []
    out[-1][1] = len(ops)
    return out


def steps(markers: list[tuple[int, str]]) -> list[int]:
    """The calls after which each optimizer step ended (the "step" markers)."""
    return [n for n, name in markers if name == "step"]
