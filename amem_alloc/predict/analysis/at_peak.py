"""What holds memory: at the peak of allocated memory (every storage live then, by category,
module and op) and over the run (each category's largest live total, what is live at each
marker), from one walk of the recorded program (requests rounded to torch's 512 B) and a second up
to the peak. A long program (a decode loop written out: millions of ops) is walked with numpy
(_Arrays) when each key is allocated once and freed at most once, after its allocation: the same
figures, op for op, in a fraction of the time and memory.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import itertools

import numpy as np

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


def live_at(ops: list[tuple], op: int) -> dict[int, int]:
    """key -> bytes (rounded to 512 B) of each storage live after op `op`."""
    live: dict[int, int] = {}
    for kind, key, size, _ in ops[: op + 1]:
        if kind == replay.ALLOC:
            live[key] = round_block(size)
        elif kind == replay.FREE:
            live.pop(key, None)
    return live


class _Arrays:
    """_Walk's figures with numpy, for a program whose keys are each allocated once and freed at
    most once after it (`simple()` says whether this one is)."""
    FAST_FROM = 100_000   # ops: below, the plain walk is as fast

    def __init__(self, ops: list[tuple], infos: dict[int, Any], markers: list[tuple[int, str]]) -> None:
        flat = np.fromiter(itertools.chain.from_iterable(ops), dtype=np.int64, count=4 * len(ops)).reshape(-1, 4)
        self.n, kind, key = len(ops), flat[:, 0], flat[:, 1]
        self.alloc_at = np.flatnonzero(kind == replay.ALLOC)
        self.free_at = np.flatnonzero(kind == replay.FREE)
        self.alloc_keys, free_keys = key[self.alloc_at], key[self.free_at]
        order = np.argsort(self.alloc_keys, kind="stable")
        self.sorted_keys = self.alloc_keys[order]
        found = np.searchsorted(self.sorted_keys, free_keys).clip(0, max(len(order) - 1, 0))
        hit = (self.sorted_keys[found] == free_keys) if len(order) else np.zeros(len(free_keys), bool)
        self.freed = order[found[hit]]                 # which allocation each matched free frees
        self.freed_at, self.free_hit = self.free_at[hit], hit
        self.simple_ok = bool(np.all(self.sorted_keys[1:] != self.sorted_keys[:-1])
                              and np.bincount(self.freed, minlength=1).max() <= 1
                              and np.all(self.freed_at > self.alloc_at[self.freed]))
        if not self.simple_ok:
            return
        sizes = flat[self.alloc_at, 2]
        distinct = _distinct(sizes)
        rounded = np.array([round_block(int(v)) for v in distinct], dtype=np.int64)
        self.bytes = rounded[np.searchsorted(distinct, sizes)] if len(sizes) else sizes
        names = [getattr(infos.get(int(k)), "category", None) or "unknown" for k in self.alloc_keys]
        self.cats = sorted(set(names))
        index = {c: i for i, c in enumerate(self.cats)}
        self.cat = np.fromiter((index[c] for c in names), dtype=np.int64, count=len(names))
        self.markers = sorted(markers)

    def simple(self) -> bool:
        return self.simple_ok

    def _deltas(self, which: np.ndarray | None = None) -> np.ndarray:
        """Bytes each op adds (allocs) or takes (frees), of the allocations `which` selects."""
        d = np.zeros(self.n, dtype=np.int64)
        take = np.ones(len(self.alloc_at), bool) if which is None else which
        d[self.alloc_at[take]] += self.bytes[take]
        freed = take[self.freed]
        d[self.freed_at[freed]] -= self.bytes[self.freed[freed]]
        return np.cumsum(d)

    def walk(self) -> tuple[int, int, dict[str, int], list[dict]]:
        """(peak op, peak bytes, each category's peak, the figures at each marker); one cumulative
        sum at a time (a category's is dropped once its peak and marker values are read)."""
        at = np.array([min(op, self.n) - 1 for op, _ in self.markers], dtype=np.int64)
        total = self._deltas()
        peak_op = int(np.argmax(total)) if len(self.alloc_at) and total.max() > 0 else -1
        peak, totals = int(total[peak_op]) if peak_op >= 0 else 0, total[at.clip(0)] * (at >= 0)
        del total
        peaks, by_marker = {}, {}
        for i, c in enumerate(self.cats):
            t = self._deltas(self.cat == i)
            if len(t) and t.max() > 0:
                peaks[c] = int(t.max())
            by_marker[c] = t[at.clip(0)] * (at >= 0)
        at_markers = [{"marker": name, "op": op, "allocated": int(totals[m]),
                       "categories": _sorted({c: int(v[m]) for c, v in by_marker.items() if v[m]})}
                      for m, (op, name) in enumerate(self.markers)]
        return peak_op, peak, peaks, at_markers

    def live_at(self, op: int) -> dict[int, int]:
        freed = np.full(len(self.alloc_at), self.n, dtype=np.int64)
        freed[self.freed] = self.freed_at
        live = np.flatnonzero((self.alloc_at <= op) & (freed > op))
        return {int(self.alloc_keys[i]): int(self.bytes[i]) for i in live}


def _distinct(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values (np.unique's hashing is slower for millions of int64s)."""
    v = np.sort(values)
    return v[np.concatenate(([True], v[1:] != v[:-1]))] if len(v) else v


def _walked(ops: list[tuple], infos: dict[int, Any], markers: list[tuple[int, str]]):
    """(peak op, peak bytes, category peaks, figures at markers, live at the peak), by numpy where it can."""
    if len(ops) >= _Arrays.FAST_FROM:
        arrays = _Arrays(ops, infos, markers)
        if arrays.simple():
            peak_op, peak, peaks, at_markers = arrays.walk()
            return peak_op, peak, peaks, at_markers, arrays.live_at(peak_op)
    walk = _Walk(infos, markers).run(ops)
    return walk.peak_op, walk.peak, walk.peaks, walk.at_markers, live_at(ops, walk.peak_op)


def figures(ops: list[tuple], infos: dict[int, Any], markers: list[tuple[int, str]], base: str | None = None,
            top: int = 10) -> tuple[AtPeak, OverRun]:
    """(what is live at the peak of allocated memory, figures over the whole run)."""
    peak_op, peak_bytes, cat_peaks, at_markers, live = _walked(ops, infos, markers)
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
    phase = (getattr(infos.get(ops[peak_op][1]), "phase", "") or None) if peak_op >= 0 else None
    peak = AtPeak(peak_op, peak_bytes, _sorted(cats), _sorted(mods), _sorted(by_op),
                  [_describe(k, n, infos.get(k), base) for k, n in largest], live, phase)
    return peak, OverRun(_sorted(cat_peaks), at_markers)


def _describe(key: int, n: int, info: Any, base: str | None) -> dict:
    return {"bytes": n, "category": getattr(info, "category", None), "module": getattr(info, "module", None),
            "op": getattr(info, "op", None), "where": made_at(info, base)}


def made_at(info: Any, base: str | None) -> str | None:
    """"train.py:12": the first frame of a storage's allocation (AllocInfo.frames), None without one."""
    frames = list(getattr(info, "frames", ()) or ())
    return f"{display_path(frames[0][0], base)}:{frames[0][1]}" if frames else None
