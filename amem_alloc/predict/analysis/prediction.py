"""The prediction's answer: per policy, peaks, the smallest capacity that runs, whether it fits;
what holds memory at the peak; JSON, text and a torch-format trace (report/predict.py draws the
HTML report from the JSON's data and the trace).

Design note
-----------
Input is the recorded program (every allocation's requested bytes and stream, every free, every
empty_cache, in order) and the engine's AllocInfo per allocation key. Everything here is a replay
of that program through amem's C++ core on the sim backend:

* per policy (replay/evaluation.py's `evaluate`, judged against the card's usable memory by the
  smallest capacity): the peaks on an unlimited sim device, min_capacity (the smallest device, in
  2 MiB steps, on which the C++ loop finishes the program with no failed allocation; a failed
  request first frees the cache and retries, as torch does, so it can be below the unlimited peak
  reserved), fits (min_capacity <= the card's usable memory: total less the CUDA context, gpus.py)
  and headroom = usable - peak reserved (negative while it fits: the run survives by emptying its
  cache when a cudaMalloc fails, which costs time);
* at_peak: the storages live when allocated bytes (each request rounded to torch's 512 B)
  were highest, summed by the engine's category, module, and op / autograd node;
* the trace: the program re-run step by step on a fresh core with its event ring on, dumped by
  amem_alloc.snapshot (torch's `_snapshot()` format), each event's frames taken from its
  allocation's AllocInfo and its user_metadata naming the category and module.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ... import policies as policies_mod
from ... import replay
from ...replay.evaluation import PolicyRow, align, evaluate, format_table
from ..._C import CoreAllocator
from ...code_files import display_path
from ...introspection import format_bytes
from ...report.predict import note_line
from ...snapshot import round_block
from ..gpus import Gpu
from ..notes import displayed
from .verdict import text_lines as verdict_text
from .verdict import verdict

NOTE = ("PREDICTION without a GPU: the code ran on fake CUDA tensors (no compute); the figures are what "
        "each allocator policy does with the allocations CUDA would have received.")


# ============================================================================ at the peak
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


def _sorted(d: dict[str, int]) -> dict[str, int]:
    return dict(sorted(d.items(), key=lambda kv: -kv[1]))


def at_peak(ops: list[tuple], infos: dict[int, Any], top: int = 10, base: str | None = None) -> AtPeak:
    sizes: dict[int, int] = {}
    allocated = peak = 0
    peak_op = -1
    for i, (kind, key, size, _) in enumerate(ops):
        if kind == replay.ALLOC:
            if key in sizes:
                allocated -= sizes.pop(key)
            sizes[key] = round_block(size)
            allocated += sizes[key]
            if allocated > peak:
                peak, peak_op = allocated, i
        elif kind == replay.FREE:
            allocated -= sizes.pop(key, 0)
    live: dict[int, int] = {}
    for kind, key, size, _ in ops[: peak_op + 1]:
        if kind == replay.ALLOC:
            live[key] = round_block(size)
        elif kind == replay.FREE:
            live.pop(key, None)
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
    return AtPeak(peak_op, peak, _sorted(cats), _sorted(mods), _sorted(by_op),
                  [_describe(k, n, infos.get(k), base) for k, n in largest], live, phase)


@dataclass
class OverRun:
    """Figures over the whole run, not only at the peak."""
    category_peaks: dict[str, int]    # each category's largest live total (requests rounded to 512 B)
    at_markers: list[dict]            # at each marker (a step): {"marker", "op", "allocated", "categories"}


def over_run(ops: list[tuple], infos: dict[int, Any], markers: list[tuple[int, str]]) -> OverRun:
    """Each category's largest live total, and what is live by category at each marker (a marker
    at index i was placed after the first i allocator calls)."""
    live: dict[int, tuple[int, str]] = {}
    totals: dict[str, int] = {}
    peaks: dict[str, int] = {}
    at_markers = []
    pending = sorted(markers)
    m = 0

    def mark(i: int) -> None:
        nonlocal m
        while m < len(pending) and pending[m][0] <= i:
            at_markers.append({"marker": pending[m][1], "op": pending[m][0], "allocated": sum(totals.values()),
                               "categories": _sorted({k: v for k, v in totals.items() if v})})
            m += 1

    for i, (kind, key, size, _) in enumerate(ops):
        mark(i)
        if kind == replay.ALLOC:
            n = round_block(size)
            cat = getattr(infos.get(key), "category", None) or "unknown"
            old = live.pop(key, None)
            if old is not None:
                totals[old[1]] -= old[0]
            live[key] = (n, cat)
            totals[cat] = totals.get(cat, 0) + n
            if totals[cat] > peaks.get(cat, 0):
                peaks[cat] = totals[cat]
        elif kind == replay.FREE:
            old = live.pop(key, None)
            if old is not None:
                totals[old[1]] -= old[0]
    mark(len(ops))
    return OverRun(_sorted(peaks), at_markers)


def _describe(key: int, n: int, info: Any, base: str | None) -> dict:
    frames = list(getattr(info, "frames", ()) or ())
    where = f"{display_path(frames[0][0], base)}:{frames[0][1]}" if frames else None
    return {"bytes": n, "category": getattr(info, "category", None), "module": getattr(info, "module", None),
            "op": getattr(info, "op", None), "where": where}


# ============================================================================ the whole answer
@dataclass
class Prediction:
    target: str
    gpu: Gpu
    rows: list[PolicyRow]
    at_peak: AtPeak
    ops: list[tuple]
    infos: dict[int, Any]
    markers: list[tuple[int, str]]
    trace_conf: str                     # the policy the trace and the live answers used
    seconds: dict[str, float]           # recording, analysis
    notes: list[dict] = field(default_factory=list)   # notes.Note.as_dict(): stand-ins, estimates, not modelled
    stopped_after: str | None = None    # why the script was stopped early (script.py's step limit), in words
    what_if: list = field(default_factory=list)   # whatif.WhatIf per change asked for (whatif.py)
    autocast_keys: frozenset = frozenset()          # storages .to() made while autocast was on (predict/verdict.py)
    over_run: OverRun | None = None     # each category's largest total, and the live bytes at each marker
    script_folder: str | None = None    # the predicted script's folder: its files are shown relative to it

    @property
    def program(self) -> replay.Program:
        return replay.Program(replay.pack(self.ops))

    def row(self, policy: str) -> PolicyRow:
        return next(r for r in self.rows if r.policy == policy)

    def to_dict(self) -> dict:
        g = self.gpu
        allocs = sum(1 for op in self.ops if op[0] == replay.ALLOC)
        return {
            "predicted": True, "note": NOTE, "target": self.target,
            "gpu": {"name": g.name, "key": g.key, "capacity_bytes": g.total_memory, "context_bytes": g.context,
                    "usable_bytes": g.usable, "capability": list(g.capability),
                    "memory_source": g.memory_source, "context_source": g.context_source},
            "policies": [_row_json(r) for r in self.rows],
            "at_peak": self.at_peak.categories,
            "at_peak_allocated": self.at_peak.allocated,
            "at_peak_op": self.at_peak.op,
            "at_peak_modules": self.at_peak.modules,
            "at_peak_ops": self.at_peak.ops,
            "at_peak_largest": self.at_peak.largest,
            "at_peak_phase": self.at_peak.phase,
            "category_peaks": self.over_run.category_peaks if self.over_run else {},
            "at_markers": self.over_run.at_markers if self.over_run else [],
            "program": {"ops": len(self.ops), "allocations": allocs,
                        "markers": [[i, name] for i, name in self.markers]},
            "seconds": self.seconds,
            "notes": self.notes,
            "stopped_after": self.stopped_after,
            **_what_if_json(self),
            "verdict": verdict(self),
        }

    def write_json(self, path: str | Path) -> Path:
        from ...atomic_write import write_text

        return write_text(path, json.dumps(self.to_dict(), indent=1))

    def snapshot(self) -> dict:
        """The predicted run in torch's snapshot format, its frames' files as display_path shows them."""
        return _display_frames(predicted_snapshot(self.ops, self.infos, self.trace_conf), self.script_folder)

    def write_trace(self, path: str | Path) -> Path:
        from ...snapshot import save_snapshot

        return save_snapshot(self.snapshot(), path)

    def write_report(self, path: str | Path, ranks: list[tuple[int, "Prediction"]] | None = None) -> Path:
        """The HTML page; with `ranks` (every rank's prediction of a job) their timelines side by side too."""
        from ...atomic_write import write_text
        from ...report.predict import render

        own = self.snapshot()
        built = {id(self.ops): own}   # equal ranks share one recorded program, this one among them

        def snapshot_of(p: "Prediction") -> dict:
            if id(p.ops) not in built:
                built[id(p.ops)] = p.snapshot()
            return built[id(p.ops)]
        others = [(rank, snapshot_of(p)) for rank, p in ranks] if ranks else None
        return write_text(path, render(self.to_dict(), own, others))

    def format_text(self, top: int = 8) -> str:
        return format_text(self, top)


def _row_json(row: PolicyRow) -> dict:
    """A policy's row in predict's JSON: the row less its timeline (a list of samples, big, that predict does not use)."""
    return {k: v for k, v in row.to_dict().items() if k != "timeline"}


def analyse(target: str, gpu: Gpu, policies: Iterable[policies_mod.Policy], ops: list[tuple],
            infos: dict[int, Any], markers: list, trace_conf: str = "", recording_s: float = 0.0,
            notes: list[dict] | None = None) -> Prediction:
    started = time.perf_counter()
    program = replay.Program(replay.pack(ops))
    rows = evaluate(program, policies, gpu.usable, search_min_capacity=True, max_samples=0)
    base = script_folder(target)
    peak = at_peak(ops, infos, base=base)
    run = over_run(ops, infos, list(markers))
    return Prediction(target, gpu, rows, peak, ops, infos, list(markers), trace_conf,
                      {"recording": recording_s, "analysis": time.perf_counter() - started},
                      shown_notes(notes, base), over_run=run, script_folder=base)


def shown_notes(notes: list[dict] | None, base: str | None) -> list[dict]:
    """The notes as the output shows them: each place named relative to the script's folder."""
    return [dict(n, where=displayed(n["where"], base)) for n in notes or []]


def script_folder(target: str) -> str | None:
    """The folder of a predicted script, from the prediction's target ("script train.py --x 1",
    "rank 0 of 2: train.py --x 1"); None for a function or a workload."""
    if target.startswith("rank "):
        target = "script " + target.split(": ", 1)[-1]
    parts = target.split()
    if len(parts) >= 2 and parts[0] == "script" and parts[1].endswith(".py"):
        return os.path.dirname(os.path.abspath(parts[1]))
    return None


# ============================================================================ text
POLICY_COLUMNS = ("policy", "peak allocated", "peak reserved", "min capacity", "fits", "headroom", "frag. at peak")


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.0%}" if whole else "-"


def format_text(p: Prediction, top: int = 8) -> str:
    g = p.gpu
    ctx = f"context ~{format_bytes(g.context)} ({g.context_source})" if g.context else "no context taken"
    lines = [f"amem predict: {p.target} on {g.name} ({format_bytes(g.total_memory)}; {ctx}; "
             f"usable {format_bytes(g.usable)})", NOTE, ""]
    if p.stopped_after:
        lines[-1:-1] = [p.stopped_after[0].upper() + p.stopped_after[1:] + "."]
    if not any(op[0] == replay.ALLOC for op in p.ops):
        lines += ["No CUDA allocation was recorded: does the code put its tensors on a CUDA device "
                  "(device=\"cuda\", .cuda(), .to(\"cuda\"))?", ""]
    if p.rows:
        lines += verdict_text(verdict(p))
    lines += format_table([r.to_dict() for r in p.rows], POLICY_COLUMNS)
    if any(r.fits and r.headroom < 0 for r in p.rows):
        lines.append("* fits only by emptying its cache when a cudaMalloc fails (torch retries), which costs time")
    best = min(p.rows, key=lambda r: (r.min_capacity, r.peak_reserved), default=None)
    if best is not None:
        lines.append(f"least memory needed: {best.policy} ({format_bytes(best.min_capacity)})")
    a = p.at_peak
    during = f", in {a.phase}" if a.phase else ""
    lines += ["", f"At the peak ({format_bytes(a.allocated)} allocated{during}, after allocator call {a.op + 1} of "
                  f"{len(p.ops)}):"]
    most = p.over_run.category_peaks if p.over_run else {}
    body = [[k, format_bytes(a.categories.get(k, 0)), _share(a.categories.get(k, 0), a.allocated),
             format_bytes(most[k]) if k in most else "-"] for k in _categories(a.categories, most)]
    lines += ["  " + ln for ln in align([["category", "bytes", "share", "largest in the run"]] + body)]
    lines += ["", "  by module:"] + [f"    {format_bytes(v):>10}  {k}" for k, v in list(a.modules.items())[:top]]
    lines += ["", "  by op / autograd node:"] + [f"    {format_bytes(v):>10}  {k}" for k, v in list(a.ops.items())[:top]]
    lines += _markers_text(p, top)
    lines += ["", f"headroom: usable memory less the policy's peak reserved. Card figures: {g.memory_source}."]
    lines += _notes_text(p.notes)
    lines += _what_if_text(p)
    return "\n".join(lines)


def _what_if_json(p: Prediction) -> dict:
    from ..whatif import answers as whatif

    return whatif.to_json(p)


def _what_if_text(p: Prediction) -> list[str]:
    from ..whatif import answers as whatif

    return whatif.format_text(p, p.what_if)


def _categories(at_peak_cats: dict[str, int], most: dict[str, int]) -> list[str]:
    """The categories at the peak (largest first), then those only live elsewhere in the run."""
    return list(at_peak_cats) + [k for k in most if k not in at_peak_cats]


def _markers_text(p: Prediction, top: int) -> list[str]:
    marks = p.over_run.at_markers if p.over_run else []
    if not marks:
        return []
    shown = marks if len(marks) <= top else marks[: top - 1] + marks[-1:]
    out = ["", "  live at each marker (allocated; largest categories):"]
    for mk in shown:
        cats = ", ".join(f"{k} {format_bytes(v)}" for k, v in list(mk["categories"].items())[:3])
        out.append(f"    {mk['marker']} after call {mk['op']}: {format_bytes(mk['allocated'])}" + (f" ({cats})" if cats else ""))
    if len(shown) < len(marks):
        out.insert(-1, f"    ... {len(marks) - len(shown)} more")
    return out


def _notes_text(notes: list[dict]) -> list[str]:
    """What the prediction stood in for, estimated or did not model, one line each."""
    if not notes:
        return []
    out = ["", f"What this prediction stood in for, estimated or did not model ({len(notes)}):"]
    return out + ["  " + note_line(n) for n in notes]


# ============================================================================ the trace
class _SimAllocator:
    """What amem_alloc.snapshot.build_snapshot reads from an Allocator: its core, settings, backend."""

    backend = "sim"

    def __init__(self, conf: str) -> None:
        self._core = CoreAllocator("sim", conf, 0)

    @property
    def settings(self) -> str:
        return self._core.settings


def _frames(info: Any) -> list[dict]:
    return [{"filename": str(f[0]), "line": int(f[1]), "name": str(f[2])} for f in (getattr(info, "frames", ()) or ())]


def _label(info: Any) -> str:
    if info is None:
        return ""
    parts = [getattr(info, "category", None), getattr(info, "module", None), getattr(info, "op", None)]
    return " ".join(str(x) for x in parts if x)


def predicted_snapshot(ops: list[tuple], infos: dict[int, Any], conf: str = "", start: int = 0) -> dict:
    """The program re-run on a fresh sim core, recording from op `start`: torch's snapshot format."""
    from ...snapshot import build_snapshot

    alloc = _SimAllocator(conf)
    core, live, order = alloc._core, {}, []
    for i, (kind, key, size, stream) in enumerate(ops):
        if i == start:
            core.start_trace(4 * (len(ops) - start) + 4096)
        if kind == replay.ALLOC:
            if key in live:
                core.free(live.pop(key))
            address = core.malloc(size, stream)
            if address:
                live[key] = address
                if i >= start:
                    order.append(key)
        elif kind == replay.FREE:
            if key in live:
                core.free(live.pop(key))
        else:
            core.empty_cache()
    if start >= len(ops):
        core.start_trace(4096)
    snap = build_snapshot(alloc)
    _attach_frames(snap, infos, order, {a: k for k, a in live.items()})
    snap["allocator_settings"]["prediction"] = NOTE
    return snap


def _display_frames(snap: dict, base: str | None) -> dict:
    """The snapshot's frames with their files as code_files.display_path shows them."""
    holders = [ev for trace in snap.get("device_traces") or [] for ev in trace]
    holders += [b for seg in snap.get("segments") or [] for b in seg.get("blocks") or []]
    for holder in holders:
        for f in holder.get("frames") or []:
            f["filename"] = display_path(str(f["filename"]), base)
    return snap


def _attach_frames(snap: dict, infos: dict, order: list[int], final: dict[int, int]) -> None:
    """Frames and labels from AllocInfo: the n-th alloc event is the n-th successful malloc."""
    by_addr: dict[int, int] = {}
    n = 0
    for ev in (snap["device_traces"] or [[]])[0]:
        if ev["action"] == "alloc":
            key = order[n]
            n += 1
            by_addr[ev["addr"]] = key
        elif ev["action"] in ("free_requested", "free_completed"):
            key = by_addr.get(ev["addr"])
        else:
            continue
        info = infos.get(key)
        ev["frames"], ev["user_metadata"] = _frames(info), _label(info)
    for seg in snap["segments"]:
        for b in seg["blocks"]:
            if b["state"] != "inactive" and b["address"] in final:
                b["frames"] = _frames(infos.get(final[b["address"]]))
