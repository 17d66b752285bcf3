"""The prediction's answer: per policy, peaks, the smallest capacity that runs, whether it fits;
what holds memory at the peak (at_peak.py); its JSON and its torch-format trace. Data only: the
text and the HTML page are report/'s (report/prediction_text.py, report/predict.py), from the JSON.

Design note
-----------
Input is the RecordedRun (run.py: every allocation's requested bytes and stream, every free, every
empty_cache, in order, and the engine's AllocInfo per allocation key); `analyse(run, card,
policies)` is pure. Everything here is a replay of that program through amem's C++ core on the sim
backend:

* per policy (replay/evaluation.py's `evaluate`, judged against the card's usable memory by the
  smallest capacity): the peaks on an unlimited sim device, min_capacity (the smallest device, in
  2 MiB steps, on which the C++ loop finishes the program with no failed allocation; a failed
  request first frees the cache and retries, as torch does, so it can be below the unlimited peak
  reserved), fits (min_capacity <= the card's usable memory: total less the CUDA context, gpus.py)
  and headroom = usable - peak reserved (negative while it fits: the run survives by emptying its
  cache when a cudaMalloc fails, which costs time). The usable memory is the card's total less what
  the process holds outside the caching allocator for what this run used (context.py: the CUDA
  context, cuBLAS, cuDNN, NCCL, line by line), so fits and headroom are taken on the device total:
  peak reserved plus that part, what nvidia-smi lists for the process (`outside`; verdict.py);
* at_peak: the storages live when allocated bytes (each request rounded to torch's 512 B)
  were highest, summed by the engine's category, module, and op / autograd node;
* the trace: the program re-run on a fresh core with its event ring on (replay/traced.py), in
  torch's `_snapshot()` format, each event's frames taken from its allocation's AllocInfo and its
  user_metadata naming the category and module.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ... import policies as policies_mod
from ... import replay
from ...code_files import display_path
from ...replay.evaluation import PolicyRow, evaluate
from ...replay.traced import describe_infos, event_ops, traced_snapshot
from .. import context as context_mod
from ..gpus import Gpu
from ..notes import displayed
from ..run import NOTE, RecordedRun
from . import phases
from .at_peak import AtPeak, OverRun, figures
from .verdict import verdict



# ============================================================================ the whole answer
@dataclass
class Prediction:
    run: RecordedRun                    # what was recorded (run.py): the program, what each storage is
    gpu: Gpu
    rows: list[PolicyRow]
    at_peak: AtPeak
    seconds: dict[str, float]           # recording, analysis
    notes: list[dict] = field(default_factory=list)   # the run's notes as shown (places relative to the script)
    stopped_after: str | None = None    # why the script was stopped early (script.py's step limit), in words
    what_if: list = field(default_factory=list)   # whatif/answers.WhatIf per change asked for
    what_if_json: dict = field(default_factory=dict)   # their JSON (whatif/run.py sets both)
    over_run: OverRun | None = None     # each category's largest total, and the live bytes at each marker
    script_folder: str | None = None    # the predicted script's folder: its files are shown relative to it
    outside: context_mod.Outside | None = None   # held outside the caching allocator, line by line (context.py)

    # what was recorded, as the analysis and its readers name it
    @property
    def target(self) -> str:
        return self.run.target

    @property
    def ops(self) -> list[tuple]:
        return self.run.ops

    @property
    def infos(self) -> dict[int, Any]:
        return self.run.infos

    @property
    def markers(self) -> list[tuple[int, str]]:
        return self.run.markers

    @property
    def trace_conf(self) -> str:
        return self.run.live_conf

    @property
    def autocast_keys(self) -> frozenset:
        return self.run.autocast_keys

    @property
    def program(self) -> replay.Program:
        return self.run.program

    def row(self, policy: str) -> PolicyRow:
        return next(r for r in self.rows if r.policy == policy)

    def to_dict(self) -> dict:
        g = self.gpu
        allocs = self.run.allocations
        spans = phases.spans(self.ops, self.infos)
        held = g.context
        return {
            "predicted": True, "note": NOTE, "target": self.target,
            "gpu": {"name": g.name, "key": g.key, "capacity_bytes": g.total_memory, "context_bytes": g.context,
                    "usable_bytes": g.usable, "capability": list(g.capability),
                    "memory_source": g.memory_source, "context_source": g.context_source},
            "outside_allocator": self.outside.to_dict() if self.outside is not None else None,   # the device total less peak reserved
            "libraries": dict(self.run.libraries),
            "policies": [dict(_row_json(r), device_total=r.peak_reserved + held) for r in self.rows],
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
                        "markers": [[i, name] for i, name in self.markers],
                        "phases": spans, "repeats": phases.repeats(self.ops, spans),
                        "steps": phases.steps(self.markers)},
            "seconds": self.seconds,
            "notes": self.notes,
            "compiled_regions": [dict(r, where=displayed(r["where"], self.script_folder))
                                 for r in self.run.compiled_regions],
            "stopped_after": self.stopped_after,
            **(self.what_if_json or {}),
            "verdict": verdict(self),
        }

    def write_json(self, path: str | Path) -> Path:
        from ...atomic_write import write_text

        return write_text(path, json.dumps(self.to_dict(), indent=1))

    def snapshot(self) -> dict:
        """The predicted run in torch's snapshot format, its frames' files as display_path shows them."""
        return _display_frames(predicted_snapshot(self.run), self.script_folder)

    def write_trace(self, path: str | Path) -> Path:
        from ...snapshot import save_snapshot

        return save_snapshot(self.snapshot(), path)

    def run_key(self) -> int:
        """Equal ranks share one recorded run: its identity (their snapshots are built once)."""
        return id(self.run.ops)


def _row_json(row: PolicyRow) -> dict:
    """A policy's row in predict's JSON: the row less its timeline (a list of samples, big, that predict does not use)."""
    return {k: v for k, v in row.to_dict().items() if k != "timeline"}


def analyse(run: RecordedRun, gpu: Gpu, policies: Iterable[policies_mod.Policy]) -> Prediction:
    """The answer for a recorded run on `gpu` under each policy: data only, nothing printed."""
    started = time.perf_counter()
    outside = context_mod.for_run(gpu, run.libraries)
    gpu = dataclasses.replace(gpu, context=outside.total, context_source=outside.basis,
                              context_uncertainty=outside.uncertainty)
    rows = evaluate(run.program, policies, gpu.usable, search_min_capacity=True, max_samples=0)
    base = script_folder(run.target)
    peak, over = figures(run.ops, run.infos, list(run.markers), base=base)
    return Prediction(run, gpu, rows, peak, {"recording": run.seconds, "analysis": time.perf_counter() - started},
                      shown_notes(run.notes, base), over_run=over, script_folder=base, outside=outside)


OP_COLUMN = "op"   # amem's extra column in a predicted trace: the program's op that made each event


def predicted_snapshot(run: RecordedRun, start: int = 0) -> dict:
    """A recorded run in torch's snapshot format (replayed with the core's trace on, from op `start`)."""
    snap = traced_snapshot(run.ops, describe_infos(run.infos), run.live_conf, start)
    snap["allocator_settings"]["prediction"] = NOTE
    for device, extra in enumerate(snap.get("amem", {}).get("devices") or []):   # each event's op (OP_COLUMN)
        extra.setdefault("columns", {})[OP_COLUMN] = event_ops(run.ops, snap["device_traces"][device], start)
    return snap


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


# ============================================================================ the trace
def _display_frames(snap: dict, base: str | None) -> dict:
    """The snapshot's frames with their files as code_files.display_path shows them."""
    holders = [ev for trace in snap.get("device_traces") or [] for ev in trace]
    holders += [b for seg in snap.get("segments") or [] for b in seg.get("blocks") or []]
    for holder in holders:
        for f in holder.get("frames") or []:
            f["filename"] = display_path(str(f["filename"]), base)
    return snap
