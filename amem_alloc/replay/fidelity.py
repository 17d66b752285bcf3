"""Fidelity: does the emulation of torch's allocator make the native allocator's own decisions?

Design note
-----------
Snapshots written by torch carry the native allocator's segment events (segment_alloc/free,
segment_map/unmap for expandable segments): its decisions. replay.trace_program turns the trace's
requests into a program and keeps those events aside; here the program runs under the policy
that emulates the native settings (policies.from_settings) with the core's trace on, and the two
sequences of segment events are compared. The figures:

* match rate: difflib.SequenceMatcher over the two sequences of (action, bytes), addresses left
  out (the sim backend's addresses are its own): 2 * matched / (native events + replay events),
  1.0 when the sequences are identical. Order matters: the same segments made at other times
  do not match.
* peak reserved delta: (replay - native) / native, the native peak being the reserved bytes at
  the start (the rebuilt segments) plus the running sum of its segment events.
* final segments identical: how many of the snapshot's final segments the replay ends with, by
  size and block layout ((block bytes, active) in address order).

A device whose start state cannot be rebuilt (replay.TraceProgram.start == "unknown") gets no
figures, only the reason.
"""
from __future__ import annotations

import difflib
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from .. import policies
from . import program as replay
from ..snapshot import load_snapshot


@dataclass
class Fidelity:
    trace: str
    device: int
    policy: str               # the policy that emulates the native settings
    start: str                # "empty", "rebuilt" or "unknown"
    start_reason: str
    ops: int
    releases: int             # cache releases taken from the trace (see replay/program.py)
    ooms: int                 # oom events in the trace
    native_events: int        # native segment events
    replay_events: int
    matched: int
    match_rate: float | None
    native_peak_reserved: int | None
    replay_peak_reserved: int
    final_segments: int       # in the snapshot, this device
    final_identical: int | None
    seconds: float

    @property
    def reproducible(self) -> bool:
        return self.start != "unknown"

    @property
    def peak_delta(self) -> float | None:
        if not self.native_peak_reserved:
            return None
        return (self.replay_peak_reserved - self.native_peak_reserved) / self.native_peak_reserved

    def to_dict(self) -> dict:
        return dict(asdict(self), peak_delta=self.peak_delta, reproducible=self.reproducible)


def match(native: list[tuple[str, int]], ours: list[tuple[str, int]]) -> tuple[int, float]:
    """(matched events, match rate) of two sequences of (action, bytes)."""
    if not native and not ours:
        return 0, 1.0
    matcher = difflib.SequenceMatcher(None, native, ours, autojunk=False)
    return sum(b.size for b in matcher.get_matching_blocks()), matcher.ratio()


def identical_segments(snapshot_segments: list[dict], run: replay.Run) -> int:
    """How many of the snapshot's final segments the replay ends with (by size and block layout)."""
    native = Counter(replay.segment_layouts(snapshot_segments))
    return sum((native & Counter(run.final_segments or [])).values())


def measure_program(name: str, snapshot: dict, tp: replay.TraceProgram) -> Fidelity:
    policy = policies.from_settings(snapshot.get("allocator_settings"), tp.native.expandable)
    run = replay.run(tp.program, policy.conf, record_segments=True)
    native = [(a, size) for _, a, size in tp.native.segment_events]
    final = replay.final_segments(snapshot, tp.device)
    known = tp.reproducible
    matched, rate = match(native, run.segment_events or [])
    return Fidelity(name, tp.device, policy.name, tp.start, tp.start_reason, len(tp.program), tp.releases,
                    len(tp.native.ooms), len(native), len(run.segment_events or []), matched,
                    rate if known else None, tp.native.peak_reserved if known else None, run.peak_reserved,
                    len(final), identical_segments(final, run) if known else None, run.seconds)


def measure(path: str | Path) -> list[Fidelity]:
    """Fidelity of every device of a snapshot file."""
    snapshot = load_snapshot(path)
    name = Path(path).name
    return [measure_program(name, snapshot, tp) for tp in replay.trace_programs(snapshot)]
