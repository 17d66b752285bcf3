"""Memory that grows with every step: what a prediction of a few steps cannot see at its peak.

Design note
-----------
A prediction runs a training script for a few optimizer steps (script.py's --steps) and answers
from their peak. A script that keeps something from every step (`history.append(out)`, a loss
kept with its graph, a cache that never evicts) needs more with each step, and a real run of
thousands of steps fails long after the steps predicted: "fits" would be wrong without a word.

From the allocated bytes at each step's end (at_peak.py's markers): where the last steps each
ended with more than the one before, by at least MIN_GROWTH each, allocated memory grows. What
grows is the storages the steps keep: made during one step and still live at the end of a later
one, summed by the user's line that made them (the first frame of their allocation); ends that
rise only by what each step holds itself (its batch, of another length each time) are no growth.
With each policy's spare (the verdict's), the steps left before it is gone: spare / growth per
step. A run with fewer than MIN_STEPS steps says nothing: the first step makes the optimizer's
state, so growth is read from the steps after it.
"""
from __future__ import annotations

from typing import Any

from ... import replay
from .at_peak import live_at, made_at

MIN_STEPS = 3               # step ends needed: two increases after the first step
MIN_GROWTH = 64 << 10       # bytes a step must add, each of the last steps
STEPS_READ = 3              # how many of the last increases must all be growth
TOP_SITES = 3


def per_step(ops: list[tuple], infos: dict[int, Any], at_markers: list[dict], base: str | None) -> dict | None:
    """{"bytes_per_step", "steps": [first, last], "allocated": [at each of those steps' ends],
    "sites": [{"where", "bytes_per_step"}]} where allocated memory grows every step, else None."""
    ends = [m for m in at_markers if m["marker"] == "step"]
    if len(ends) < MIN_STEPS:
        return None
    increases = [b["allocated"] - a["allocated"] for a, b in zip(ends, ends[1:])][-STEPS_READ:]
    if min(increases) < MIN_GROWTH:
        return None
    steps = len(increases)
    first = len(ends) - steps   # the step (1-based) whose end the growth is counted from
    per_step_bytes = sum(increases) // steps
    kept = _kept(ops, infos, [m["op"] for m in ends[first - 1:]], base)
    if sum(kept.values()) < max(MIN_GROWTH, per_step_bytes // 2):
        return None   # the ends differ by what each step holds itself (a batch of another length)
    top = sorted(kept.items(), key=lambda kv: -kv[1])[:TOP_SITES]
    return {"bytes_per_step": per_step_bytes, "steps": [first, len(ends)],
            "allocated": [m["allocated"] for m in ends[first - 1:]],
            "sites": [{"where": w, "bytes_per_step": n} for w, n in top if n >= per_step_bytes // 100]}


def _kept(ops: list[tuple], infos: dict[int, Any], window: list[int], base: str | None) -> dict[str, int]:
    """Bytes per step each user's line made that the steps keep: storages made during the steps of
    `window` (the ops at their ends) but the last and still live at its end (a step's own
    storages, live at its end and gone in the next, are not growth)."""
    start, stop, end = window[0], window[-2], window[-1]
    made = {key for kind, key, _, _ in ops[start:stop] if kind == replay.ALLOC}
    by_site: dict[str, int] = {}
    for key, size in live_at(ops, end - 1).items():   # (a marker's op: the ops before it had run)
        if key in made:
            where = made_at(infos.get(key), base) or "(no frame of the script's)"
            by_site[where] = by_site.get(where, 0) + size
    steps = len(window) - 2
    return {where: n // steps for where, n in by_site.items()}


def steps_left(growth: dict | None, spare: int) -> int | None:
    """How many more steps the spare memory lasts at that growth (None: no growth, or none spare)."""
    if growth is None or spare <= 0:
        return None
    return spare // growth["bytes_per_step"]
