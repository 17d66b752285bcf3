"""What holds memory: at the peak of allocated memory (every storage live then, by category,
module and op) and over the run (each category's largest live total, what is live at each
marker), from one walk of the recorded program (requests rounded to torch's 512 B) and a second up
to the peak.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ... import replay
from ...code_files import display_path
from ...snapshot import round_block


@dataclass
class AtPeak:
    op: int                           # index of the op after which allocated bytes peaked
    allocated: int                    # bytes (requests rounded to 512 B) live then
    categories: dict[str, int]
    modules: dict[str, int]
    ops: dict[str, int]               # aten op or autograd node
    largest: list[dict] = field(default_factory=list)
    live: dict[int, int] = field(default_factory=dict)   # key -> bytes of each storage live then
    phase: str | None = None          # forward, backward, optimizer or other: when the peak's allocation was made


@dataclass
class OverRun:
    """Figures over the whole run, not only at the peak."""
    category_peaks: dict[str, int]    # each category's largest live total (requests rounded to 512 B)
    at_markers: list[dict]            # at each marker (a step): {"marker", "op", "allocated", "categories"}


def _sorted(d: dict[str, int]) -> dict[str, int]:
    return dict(sorted(d.items(), key=lambda kv: -kv[1]))


class _Walk:
    """One pass over the program: live bytes by category, their peaks, the markers' figures, and
    the op after which allocated bytes peaked."""

    def __init__(self, infos: dict[int, Any], markers: list[tuple[int, str]]) -> None:
        self.infos = infos
        self.live: dict[int, tuple[int, str]] = {}
        self.totals: dict[str, int] = {}
        self.peaks: dict[str, int] = {}
        self.allocated = self.peak = 0
        self.peak_op = -1
        self.pending, self.m, self.at_markers = sorted(markers), 0, []

    def mark(self, i: int) -> None:
        while self.m < len(self.pending) and self.pending[self.m][0] <= i:
            op, name = self.pending[self.m]
            self.at_markers.append({"marker": name, "op": op, "allocated": sum(self.totals.values()),
                                    "categories": _sorted({k: v for k, v in self.totals.items() if v})})
            self.m += 1

    def drop(self, key: int) -> None:
        old = self.live.pop(key, None)
        if old is not None:
            self.totals[old[1]] -= old[0]
            self.allocated -= old[0]

    def alloc(self, i: int, key: int, size: int) -> None:
        self.drop(key)
        n, cat = round_block(size), getattr(self.infos.get(key), "category", None) or "unknown"
        self.live[key] = (n, cat)
        self.totals[cat] = self.totals.get(cat, 0) + n
        if self.totals[cat] > self.peaks.get(cat, 0):
            self.peaks[cat] = self.totals[cat]
        self.allocated += n
        if self.allocated > self.peak:
            self.peak, self.peak_op = self.allocated, i

    def run(self, ops: list[tuple]) -> "_Walk":
        for i, (kind, key, size, _) in enumerate(ops):
            self.mark(i)
            if kind == replay.ALLOC:
                self.alloc(i, key, size)
            elif kind == replay.FREE:
                self.drop(key)
        self.mark(len(ops))
        return self


def _live_at(ops: list[tuple], op: int) -> dict[int, int]:
    live: dict[int, int] = {}
    for kind, key, size, _ in ops[: op + 1]:
        if kind == replay.ALLOC:
            live[key] = round_block(size)
        elif kind == replay.FREE:
            live.pop(key, None)
    return live


def figures(ops: list[tuple], infos: dict[int, Any], markers: list[tuple[int, str]], base: str | None = None,
            top: int = 10) -> tuple[AtPeak, OverRun]:
    """(what is live at the peak of allocated memory, figures over the whole run)."""
    walk = _Walk(infos, markers).run(ops)
    live = _live_at(ops, walk.peak_op)
    cats: dict[str, int] = {}
    mods: dict[str, int] = {}
    by_op: dict[str, int] = {}
    for key, n in live.items():
        info = infos.get(key)
        cat = getattr(info, "category", None) or "unknown"
        cats[cat] = cats.get(cat, 0) + n
        mod = getattr(info, "module", None) or f"(outside any module: {cat})"   # broken down by what it is
        mods[mod] = mods.get(mod, 0) + n
        op = getattr(info, "op", None) or "(unknown op)"
        by_op[op] = by_op.get(op, 0) + n
    largest = sorted(live.items(), key=lambda kv: -kv[1])[:top]
    phase = (getattr(infos.get(ops[walk.peak_op][1]), "phase", "") or None) if walk.peak_op >= 0 else None
    peak = AtPeak(walk.peak_op, walk.peak, _sorted(cats), _sorted(mods), _sorted(by_op),
                  [_describe(k, n, infos.get(k), base) for k, n in largest], live, phase)
    return peak, OverRun(_sorted(walk.peaks), walk.at_markers)


def _describe(key: int, n: int, info: Any, base: str | None) -> dict:
    frames = list(getattr(info, "frames", ()) or ())
    where = f"{display_path(frames[0][0], base)}:{frames[0][1]}" if frames else None
    return {"bytes": n, "category": getattr(info, "category", None), "module": getattr(info, "module", None),
            "op": getattr(info, "op", None), "where": where}
