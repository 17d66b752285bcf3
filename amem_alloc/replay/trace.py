"""`amem replay TRACE --policy ...`: a trace replayed under allocator policies, with its report.

A trace is a snapshot pickle written by torch (torch.cuda.memory._dump_snapshot, from anywhere)
or by amem, or a program recorded by `amem compare` (.npz). Every device with events is turned
into a program (replay.trace_program: pre-existing blocks, rebuilt start state, cache releases)
and evaluated under each policy (replay/evaluation.py: the C++ core on the sim backend, one
PolicyRow per policy). Where the trace carries the native allocator's segment events, the report
adds the native figures and the fidelity of the policy that emulates the native settings
(replay/fidelity.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import policies as policies_mod
from ..introspection import format_bytes
from . import evaluation
from . import fidelity as fidelity_mod
from . import program as replay

BARS = " ▁▂▃▄▅▆▇█"


@dataclass
class Capacity:
    """The device capacity a replay assumes, and where that figure comes from."""

    bytes: int            # 0: unlimited
    source: str           # "unlimited", "--limit-gb" or "oom event"
    reason: str           # the sentence the report prints
    oom_op: int | None = None  # the request at which the native run hit it

    @property
    def limited(self) -> bool:
        return self.bytes > 0


def start_bytes(tp: replay.TraceProgram) -> int:
    """What the start state takes: the native allocator's reserved bytes when recording began, or
    (where those are unknown) the bytes of the blocks live then."""
    ops = tp.program.ops[: tp.program.prologue]
    live = int(ops["size"][ops["kind"] == replay.ALLOC].sum()) if len(ops) else 0
    return max(tp.native.initial_reserved, live)


def capacity_of(tp: replay.TraceProgram, limit_bytes: int) -> Capacity:
    """--limit-gb if given; else the capacity the trace's first oom event shows (free + reserved then)."""
    if limit_bytes:
        return Capacity(limit_bytes, "--limit-gb", f"{format_bytes(limit_bytes)}, as --limit-gb says")
    if not tp.native.ooms:
        return Capacity(0, "unlimited", "unlimited: the trace has no oom event (--limit-gb N sets a capacity)")
    oom = tp.native.ooms[0]
    if not tp.reproducible or not (tp.native.segment_events or tp.start == "empty"):
        why = tp.start_reason if not tp.reproducible else "the trace has no segment events"
        return Capacity(0, "unlimited", "unlimited: the trace has an oom event, but the native allocator's reserved "
                        f"bytes at that moment are unknown ({why}), so its capacity is too; --limit-gb N sets one")
    reserved = tp.native.reserved_at(oom)
    total = reserved + oom["device_free"]
    return Capacity(total, "oom event", f"{format_bytes(total)}, from the trace's oom event at request "
                    f"{oom['op']}: {format_bytes(oom['device_free'])} free on the device + "
                    f"{format_bytes(reserved)} reserved by the allocator then (a {format_bytes(oom['size'])} "
                    "request failed)", oom["op"])


@dataclass
class DeviceReplay:
    trace: replay.TraceProgram
    rows: list[evaluation.PolicyRow]  # one per policy, replayed under the capacity
    fidelity: fidelity_mod.Fidelity | None = None
    capacity: Capacity = field(default_factory=lambda: Capacity(0, "unlimited", "unlimited"))
    refused: str | None = None  # why nothing was replayed (a capacity below the start state)

    @property
    def native_timeline(self) -> list[tuple[int, int | None, int]]:
        """(op, None, reserved) after each native segment event."""
        reserved = self.trace.native.initial_reserved
        points = [(self.trace.program.prologue, None, reserved)]
        for op, action, size in self.trace.native.segment_events:
            reserved += size if action in ("segment_alloc", "segment_map") else -size
            points.append((op, None, reserved))
        return points


@dataclass
class TraceReplay:
    path: str
    devices: list[DeviceReplay] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"trace": self.path, "simulated": True, "backend": "sim", "devices": [_device_dict(d) for d in self.devices]}


def _device_dict(d: DeviceReplay) -> dict:
    tp = d.trace
    native = tp.native
    return {"device": tp.device, "events": tp.events,
            "capacity": {"bytes": d.capacity.bytes, "source": d.capacity.source, "reason": d.capacity.reason,
                         "oom_op": d.capacity.oom_op}, "refused": d.refused, "ops": len(tp.program),
            "prologue": tp.program.prologue,
            "free_action": tp.free_action, "releases": tp.releases, "trace_ooms": native.ooms,
            "start": tp.start, "start_reason": tp.start_reason, "reproducible": tp.reproducible,
            "native": {"segment_events": len(native.segment_events), "device_mallocs": native.device_mallocs,
                       "peak_reserved": native.peak_reserved if tp.reproducible and native.segment_events else None,
                       "timeline": [list(p) for p in d.native_timeline]},
            "rows": [row.to_dict() for row in d.rows],
            "fidelity": d.fidelity.to_dict() if d.fidelity else None}


def _load(path: str | Path) -> tuple[dict | None, list[replay.TraceProgram]]:
    if str(path).endswith(".npz"):
        program = replay.Program.load(path)
        tp = replay.TraceProgram(program.device, program, replay.Native([], 0, False), "empty",
                                 "a program recorded by amem compare", "free", len(program), 0)
        return None, [tp]
    from ..snapshot import load_snapshot

    snapshot = load_snapshot(path)
    return snapshot, replay.trace_programs(snapshot)


def replay_trace(path: str | Path, policy_names: list[str] | None = None, device: int | None = None,
                 max_samples: int = 2000, limit_bytes: int = 0) -> TraceReplay:
    """Replays every device of `path` (or one) under each policy (default: the one emulating the
    trace's own allocator settings)."""
    snapshot, programs = _load(path)
    out = TraceReplay(str(path))
    for tp in programs:
        if device is not None and tp.device != device:
            continue
        native_policy = policies_mod.from_settings((snapshot or {}).get("allocator_settings"), tp.native.expandable)
        chosen = [policies_mod.get(n) for n in policy_names] if policy_names else [native_policy]
        out.devices.append(_replay_device(path, snapshot, tp, chosen, max_samples, limit_bytes))
    if device is not None and not out.devices:
        raise ValueError(f"amem replay: {path} has no events for device {device}")
    return out


def with_failed_requests(tp: replay.TraceProgram) -> replay.Program:
    """The program plus each request the native run failed (its oom events), tried where it failed
    and freed at once: a replay under a capacity then shows whether the policy would have served it."""
    if not tp.native.ooms:
        return tp.program
    ops, pieces, last = tp.program.ops, [], 0
    for i, oom in enumerate(sorted(tp.native.ooms, key=lambda o: o["op"])):
        key = replay.TEMP_KEY - 1 - i
        pieces += [ops[last: oom["op"]], replay.pack([(replay.ALLOC, key, oom["size"], 0), (replay.FREE, key, 0, 0)])]
        last = oom["op"]
    pieces.append(ops[last:])
    return replay.Program(np.concatenate(pieces), tp.program.prologue, tp.program.device)


def _replay_device(path, snapshot, tp: replay.TraceProgram, chosen: list, max_samples: int,
                   limit_bytes: int) -> DeviceReplay:
    capacity = capacity_of(tp, limit_bytes)
    fid = None
    if snapshot is not None and (tp.native.segment_events or tp.start != "empty"):
        fid = fidelity_mod.measure_program(Path(path).name, snapshot, tp)
    start = start_bytes(tp)
    if capacity.limited and start > capacity.bytes:
        why = (f"the capacity, {format_bytes(capacity.bytes)}, is below the start state: the trace began with "
               f"{format_bytes(start)} already held, so every request would fail; give --limit-gb of at least "
               f"{start / (1 << 30):.2f}")
        return DeviceReplay(tp, [], fid, capacity, why)
    program = with_failed_requests(tp) if capacity.limited else tp.program  # unlimited: they would just fit
    return DeviceReplay(tp, evaluation.evaluate(program, chosen, capacity.bytes, max_samples=max_samples), fid,
                        capacity)


# ---------------------------------------------------------------------------- text
def sparkline(points: list[tuple[int, float]], width: int = 64) -> str:
    """(x, value) points (x ascending, the value holding until the next point) as a row of bars:
    each column shows the highest value in its span of x."""
    if not points:
        return ""
    lo, hi = points[0][0], points[-1][0]
    width = min(width, hi - lo + 1)
    top = max(v for _, v in points) or 1
    cols, i, current = [], 0, points[0][1]
    for c in range(width):
        end = lo + (c + 1) * (hi - lo + 1) / width
        best = current
        while i < len(points) and points[i][0] < end:
            current = points[i][1]
            best = max(best, current)
            i += 1
        cols.append(BARS[round(best / top * (len(BARS) - 1))])
    return "".join(cols)


COLUMNS = ("configuration", "peak allocated", "peak reserved", "frag. at peak", "device mallocs", "device frees",
           "OOMs", "ops/s")


def _native_row(d: DeviceReplay) -> dict:
    """The native allocator's own figures from the trace, in the table's row keys (n/a: not in a trace)."""
    nat = d.trace.native
    return {"policy": "native (trace)", "peak_allocated": None,
            "peak_reserved": nat.peak_reserved if d.trace.reproducible else "unknown", "fragmentation_at_peak": None,
            "device_mallocs": nat.device_mallocs, "device_frees": len(nat.segment_events) - nat.device_mallocs,
            "ooms": len(nat.ooms), "ops_per_second": ""}


def _fidelity_line(f: fidelity_mod.Fidelity) -> str:
    if not f.reproducible:
        return f"  fidelity: not measured: the start state is unknown ({f.start_reason})"
    delta = f"{f.peak_delta:+.2%}" if f.peak_delta is not None else "n/a"
    return (f"  fidelity of {f.policy} against the native allocator's own events: {f.matched}/{f.native_events} "
            f"segment events matched ({f.match_rate:.1%} match rate, {f.replay_events} replayed), peak reserved "
            f"{delta}, {f.final_identical}/{f.final_segments} final segments identical")


def _device_text(d: DeviceReplay) -> list[str]:
    tp = d.trace
    n_oom = len(tp.native.ooms)
    tried = f" + {_count(n_oom, 'request')} that failed in the trace, tried where {'it' if n_oom == 1 else 'they'} " \
        "failed" if n_oom and d.rows and d.capacity.limited else ""
    lines = [f"device {tp.device}: {tp.events} trace events -> {len(tp.program)} requests{tried} "
             f"({tp.program.prologue} rebuild the start state); frees at {tp.free_action}; "
             f"{tp.releases} cache releases; {len(tp.native.ooms)} OOMs in the trace",
             f"  start: {tp.start}" + ("" if tp.reproducible else " (NOT reproducible)") + f": {tp.start_reason}"]
    rows = [_native_row(d)] if tp.native.segment_events else []
    rows += [row.to_dict() for row in d.rows]
    lines.append(f"  capacity: {d.capacity.reason}")
    if d.refused:
        return lines + [f"  not replayed: {d.refused}"]
    lines += [""] + ["  " + line for line in evaluation.format_table(rows, COLUMNS)] + [""]
    lines += _verdicts(d)
    if d.fidelity is not None:
        lines.append(_fidelity_line(d.fidelity) + (" (measured without a capacity limit)" if d.capacity.limited else ""))
    for r in d.rows:
        lines.append(f"  timeline ({r.policy}), {len(tp.program)} requests, peaks {format_bytes(r.peak_reserved)} "
                     f"reserved / {format_bytes(r.peak_allocated)} allocated:")
        lines.append("    reserved  " + sparkline([(s[0], s[2]) for s in r.timeline]))
        lines.append("    allocated " + sparkline([(s[0], s[1]) for s in r.timeline]))
    return lines


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _verdicts(d: DeviceReplay) -> list[str]:
    """Whether each policy would have hit the capacity (only where there is one)."""
    cap = d.capacity
    if not cap.limited:
        return []
    out = []
    if cap.source == "oom event":
        out.append(f"  native (trace): hit it at request {cap.oom_op}")
    for r in d.rows:
        if r.ooms:
            need = r.unlimited_peak_reserved
            more = f"; it needs {format_bytes(need)} reserved without a limit" if need else ""
            out.append(f"  {r.policy}: would hit it: {_count(r.ooms, 'request')} fail{'s' if r.ooms == 1 else ''}{more}")
        else:
            out.append(f"  {r.policy}: would fit, with {format_bytes(cap.bytes - r.peak_reserved)} to spare "
                       f"(peak reserved {format_bytes(r.peak_reserved)})")
    return out + [""]


def format_text(report: TraceReplay) -> str:
    lines = [f"amem replay: {report.path} — simulated: replayed through amem's C++ core on the sim backend "
             "(addresses only, no GPU)"]
    for d in report.devices:
        lines += [""] + _device_text(d)
    return "\n".join(lines)
