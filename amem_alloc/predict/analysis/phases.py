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

An eval loop's batches allocate alike: `repeats` finds, in each eval span, the shortest run of
calls (allocations by size, and frees) that repeats from the span's start, and how many times, so
the page can show the loop once with "×N". A span is folded only where the repeats cover all but
less than one iteration of it (a cut last iteration counts; a different tail is left over), frees
at its end left out (the last span runs to the program's end, where the model may be freed).
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


MAX_PERIOD = 20000   # calls per iteration looked for; each candidate stops at its first mismatch


def repeats(ops: list[tuple], spans_: list[list], phase: str = "eval") -> list[list]:
    """[[first call, last call, iterations, calls per iteration]] for each `phase` span whose calls
    repeat (two iterations at least), in the order of the spans."""
    out = []
    for first, last, name in spans_:
        if name != phase:
            continue
        sig = [(kind, size if kind == replay.ALLOC else 0) for kind, _, size, _ in ops[first - 1:last]]
        while sig and sig[-1][0] == replay.FREE:   # frees after the loop (the model, freed as the program
            sig.pop()                              # ends) are no iteration's: the last one is cut there
        found = _period(sig)
        if found:
            out.append([first, last, found[1], found[0]])
    return out


def _period(sig: list) -> tuple[int, int] | None:
    """(period, iterations) of the shortest period that repeats over all but less than one period."""
    n = len(sig)
    for p in range(1, min(n // 2, MAX_PERIOD) + 1):
        if not any(k == replay.ALLOC for k, _ in sig[:p]):
            continue
        k = p
        while k < n and sig[k] == sig[k - p]:
            k += 1
        if n - k < p:                       # what is left is less than one iteration
            count = -(-k // p) if k == n else k // p
            if count >= 2:
                return p, count
    return None


def steps(markers: list[tuple[int, str]]) -> list[int]:
    """The calls after which each optimizer step ended (the "step" markers)."""
    return [n for n, name in markers if name == "step"]
