"""Replay: a recorded allocation sequence through the C++ core on the sim backend, under any policy.

Design note
-----------
A *program* is what an allocator was asked, in order, and nothing it decided: alloc(key, size,
stream), free(key), release (its cache was emptied here), and a CUDA graph capture's private pool
opened, closed and released (pool_begin/pool_end/pool_release with the pool's number as key: every
request in between is served from that pool, as torch's capture does). Keys are the trace's addresses (or
a workload's tensor ids); the core maps them to its own addresses, so any policy replays any
program. Programs are packed 32-byte records (csrc/core/replay.h); the C++ loop runs them at
millions of ops/s.

From a torch snapshot (`trace_programs`), per device:

* alloc -> alloc(addr, requested size, stream). The free that makes memory reusable is
  `free_completed` (torch's semantics); a trace with none uses `free_requested`.
* A free with no alloc before it is a block that was live when recording began; so is a block
  active in the final `segments` that the trace never mentions. Both are allocated first, in a
  *prologue*. Where the trace carries the native allocator's segment events, the prologue also
  rebuilds the segments that were cached at the start, block for block (`_carve`): allocate the
  segment whole, free it, allocate its blocks and the free gaps between them in address order,
  then free the gaps. That puts every live block at its native offset and leaves the native
  free space cached. Otherwise the live blocks are allocated in address order on a fresh
  allocator, and the report says the start state is unknown.
* segment_alloc/free/map/unmap are the native allocator's decisions: never inputs. They are
  kept as the ground truth (`Native`) that replay/fidelity.py measures the emulation against.
  One exception: a run of segment_free or segment_unmap events means the native cache was
  emptied at that point (an empty_cache() call, or a cudaMalloc failure whose retry released
  the cache; the trace cannot tell them apart and does not record the device's free memory),
  so the program gets a `release` op there.
* oom events are noted; the failed request has no alloc event, so it is not replayed.

Running (`run`): the C++ loop (`_C.CoreAllocator.replay`, csrc/core/replay.h) runs every
program: allocs, frees, releases (empty_cache) and a prologue-end marker after which its peaks,
timeline and device-call counts start. Asked to (`record_segments`), it also returns the
segment events each op caused after the prologue, for fidelity; the final segments come from
the core's segments_json. Python only packs the program and reads the result.
"""
from __future__ import annotations

import bisect
import itertools
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from .. import _C, atomic_write
from ..introspection import parse_fragmentation, parse_stats

OPS = np.dtype([("key", "<u8"), ("size", "<u8"), ("stream", "<u8"), ("kind", "<u8")])
ALLOC, FREE, RELEASE, PROLOGUE_END = 0, 1, 2, 3   # csrc/core/replay.h ReplayKind
POOL_BEGIN, POOL_END, POOL_RELEASE = 4, 5, 6       # a CUDA graph capture's private pool (Note [captured pools])
CORE_KINDS = (ALLOC, FREE, RELEASE, POOL_BEGIN, POOL_END, POOL_RELEASE)   # what a Program holds
MiB = 1 << 20
# The core's size classes (csrc/core/size_policy.h), taken from it, never restated here:
SMALL_SEGMENT = _C.segment_size(1)                      # a small-pool segment (2 MiB)
MIN_BLOCK = _C.round_size(1, "")                        # every block is a multiple of this (512 B)
SMALL_REQUEST = next(n for n in (SMALL_SEGMENT // 2 ** k for k in range(12))
                     if _C.is_small(n))                 # the largest small-pool request (1 MiB)
TEMP_KEY = 1 << 63                # prologue keys: far above any device address
SEGMENT_ACTIONS = ("segment_alloc", "segment_free", "segment_map", "segment_unmap")
RELEASE_ACTIONS = ("segment_free", "segment_unmap")


# ============================================================================ programs
@dataclass
class Program:
    """One device's requests. ops[:prologue] rebuild the state at the start of a recording."""

    ops: np.ndarray
    prologue: int = 0
    device: int = 0

    def __len__(self) -> int:
        return len(self.ops)

    def to_bytes(self) -> bytes:
        return self.ops.tobytes()

    def core_bytes(self) -> bytes:
        """The records for the C++ loop: a prologue-end marker after the prologue, if any."""
        if not self.prologue:
            return self.to_bytes()
        marker = np.array([(0, 0, 0, PROLOGUE_END)], dtype=OPS)
        return np.concatenate([self.ops[: self.prologue], marker, self.ops[self.prologue:]]).tobytes()

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        with atomic_write.atomic_file(path, "wb") as f:  # np.savez would append .npz to a name without it
            np.savez(f, ops=self.ops, prologue=self.prologue, device=self.device)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Program":
        """Reads a program saved by save(); ValueError naming the file for anything else."""
        try:
            with np.load(path, allow_pickle=False) as data:
                ops, prologue, device = data["ops"], int(data["prologue"]), int(data["device"])
                if ops.dtype.names is None or set(OPS.names) - set(ops.dtype.names) or ops.ndim != 1:
                    raise ValueError(f"its ops array is {ops.dtype}, not amem's program records")
                program = cls(ops.astype(OPS), prologue, device)
        except OSError as err:
            raise ValueError(f"{path}: cannot read it: {err.strerror or err}") from None
        except Exception as err:  # noqa: BLE001 - truncated zip, foreign arrays, missing keys: the file's problem
            raise ValueError(f"{path}: not a program recorded by amem compare ({type(err).__name__}: {err}); "
                             "give a program.npz from amem compare, or a snapshot pickle") from None
        if not 0 <= program.prologue <= len(program) or program.device < 0:
            raise ValueError(f"{path}: not a program recorded by amem compare (prologue {program.prologue} of "
                             f"{len(program)} ops, device {program.device})")
        return program


def pack(ops: Iterable[tuple[int, int, int, int]]) -> np.ndarray:
    """(kind, key, size, stream) tuples -> packed records: numpy reads the tuples' numbers in one
    pass (np.fromiter), column by column (a predicted decode loop has millions: no second list of
    reordered tuples, no record built per op)."""
    ops = ops if isinstance(ops, list) else list(ops)
    if not ops:
        return np.zeros(0, OPS)
    if set(map(len, ops)) - {4}:
        raise ValueError("amem: a program's op is a (kind, key, size, stream) tuple")
    try:
        flat = np.fromiter(itertools.chain.from_iterable(ops), dtype=np.uint64, count=4 * len(ops)).reshape(-1, 4)
    except (OverflowError, ValueError, TypeError):   # a negative or non-integer field: numpy's own casting
        return np.array([(key, size, stream, kind) for kind, key, size, stream in ops], dtype=OPS)
    out = np.empty(len(ops), OPS)
    for column, name in enumerate(("kind", "key", "size", "stream")):
        out[name] = flat[:, column]
    return out


def program_from_events(events: Iterable[tuple[str, int, int, int]], device: int = 0) -> Program:
    """A workload's ("alloc", id, bytes, stream) / ("free", id, _, stream) events as a program."""
    kinds = {"alloc": ALLOC, "free": FREE, "release": RELEASE}
    return Program(pack((kinds[a], key, size if a == "alloc" else 0, stream) for a, key, size, stream in events),
                   0, device)


# ============================================================================ from a torch trace
@dataclass
class Native:
    """What the native allocator decided during the recording, from the trace's own events."""

    segment_events: list[tuple[int, str, int]]  # (op index in the program, action, bytes)
    initial_reserved: int                       # bytes reserved when recording began (if known)
    expandable: bool                            # expandable_segments was on
    ooms: list[dict] = field(default_factory=list)  # {op, size, device_free, reserved_change}

    def reserved_at(self, oom: dict) -> int:
        """Bytes the native allocator held when `oom` was recorded (initial + segments until then)."""
        return self.initial_reserved + oom.get("reserved_change", 0)

    @property
    def peak_reserved(self) -> int:
        reserved = peak = self.initial_reserved
        for _, action, size in self.segment_events:
            reserved += size if action in ("segment_alloc", "segment_map") else -size
            peak = max(peak, reserved)
        return peak

    @property
    def device_mallocs(self) -> int:
        return sum(a in ("segment_alloc", "segment_map") for _, a, _ in self.segment_events)


@dataclass
class TraceProgram:
    """A device of a snapshot as a program, with the native ground truth and the start state."""

    device: int
    program: Program
    native: Native
    start: str          # "empty", "rebuilt" or "unknown"
    start_reason: str   # why, in a sentence
    free_action: str    # "free_completed" or "free_requested"
    events: int         # trace entries read
    releases: int       # release ops inserted where the native cache was emptied

    @property
    def reproducible(self) -> bool:
        return self.start != "unknown"


@dataclass
class _Scan:
    """One pass over a device's trace."""

    ops: list = field(default_factory=list)             # (kind, key, size, stream)
    orphans: dict = field(default_factory=dict)         # addr -> (requested, stream): live before recording
    allocated: set = field(default_factory=set)         # every address the trace allocated
    live: dict = field(default_factory=dict)            # addr -> requested, at the end
    segments: list = field(default_factory=list)        # (op index, action, addr, size, stream)
    ooms: list = field(default_factory=list)
    releases: int = 0
    reserved_change: int = 0                            # segment bytes made minus freed so far


def _scan(events: list[dict], free_action: str) -> _Scan:
    s, in_release = _Scan(), False
    for ev in events:
        action, addr, size, stream = ev["action"], ev.get("addr", 0), ev.get("size", 0), ev.get("stream", 0)
        starts_release = action in RELEASE_ACTIONS and not in_release
        in_release = action in RELEASE_ACTIONS
        if starts_release:
            s.ops.append((RELEASE, 0, 0, 0))
            s.releases += 1
        if action == "alloc":
            s.ops.append((ALLOC, addr, size, stream))
            s.live[addr] = size
            s.allocated.add(addr)
        elif action == free_action:
            if s.live.pop(addr, None) is None and addr not in s.allocated:
                s.orphans.setdefault(addr, (size, stream))
            s.ops.append((FREE, addr, 0, stream))
        elif action in SEGMENT_ACTIONS:
            s.segments.append((len(s.ops), action, addr, size, stream))
            s.reserved_change += size if action in ("segment_alloc", "segment_map") else -size
        elif action == "oom":
            s.ooms.append({"op": len(s.ops), "size": size, "device_free": ev.get("device_free", 0),
                           "reserved_change": s.reserved_change})
    return s


def final_segments(snapshot: dict, device: int) -> list[dict]:
    return [seg for seg in snapshot.get("segments", []) if seg.get("device", 0) == device]


def _untraced_blocks(segments: list[dict], scan: _Scan) -> dict[int, tuple[int, int, int]]:
    """Blocks active at the end that the trace never allocated: addr -> (block size, requested, stream)."""
    out = {}
    for seg in segments:
        for b in seg["blocks"]:
            if b["state"] != "inactive" and b["address"] not in scan.live and b["address"] not in scan.allocated:
                out[b["address"]] = (b["size"], b["requested_size"], seg["stream"])
    return out


def _initial_segments(segments: list[dict], scan: _Scan) -> list[tuple[int, int, int, bool]] | None:
    """(addr, size, stream, small) of the segments that existed when recording began, or None if
    the trace cannot tell (expandable segments: their mapped ranges come and go)."""
    if any(seg.get("is_expandable") for seg in segments) or any(a in ("segment_map", "segment_unmap")
                                                                for _, a, *_ in scan.segments):
        return None
    created, before = set(), {}
    for _, action, addr, size, stream in scan.segments:
        if action == "segment_alloc":
            created.add(addr)
        elif addr in created:
            created.discard(addr)
        else:
            before[addr] = (size, stream)
    for seg in segments:
        if seg["address"] not in created:
            before.setdefault(seg["address"], (seg["total_size"], seg["stream"]))
    return sorted((a, size, stream, size == SMALL_SEGMENT) for a, (size, stream) in before.items())


# ---------------------------------------------------------------------------- the prologue
class _Keys:
    def __init__(self) -> None:
        self.next = TEMP_KEY

    def new(self) -> int:
        self.next += 1
        return self.next


def _pieces(seg: tuple, blocks: list[tuple[int, int | None, int]]) -> list[list] | None:
    """[addr, size, key or None (a free gap)] tiling the segment, or None if the layout is not one
    torch's policy could have made (then its blocks are allocated the plain way)."""
    addr, size, _, small = seg
    out, cursor, end = [], addr, addr + size
    for b_addr, b_size, requested in blocks:
        if b_addr < cursor:
            return None
        if b_addr > cursor:
            out.append([cursor, b_addr - cursor, None])
        extent = b_size or _C.round_size(max(requested, 1), "")
        out.append([b_addr, min(extent, end - b_addr), b_addr])
        cursor = b_addr + out[-1][1]
    if cursor < end:
        out.append([cursor, end - cursor, None])
    return _small_pieces(out) if small else _large_pieces(out)


def _large_pieces(pieces: list[list]) -> list[list] | None:
    """Large-pool blocks are all > 1 MiB: a gap of 1 MiB or less is the unsplit tail of the block before it."""
    out: list[list] = []
    for piece in pieces:
        if piece[2] is None and piece[1] <= SMALL_REQUEST and out and out[-1][2] is not None:
            out[-1][1] += piece[1]
        else:
            out.append(piece)
    return out if all(p[1] > SMALL_REQUEST for p in out) else None


def _small_pieces(pieces: list[list]) -> list[list] | None:
    """Small-pool requests are at most 1 MiB: longer gaps are carved in 1 MiB chunks (they merge when freed)."""
    out: list[list] = []
    for addr, size, key in pieces:
        if key is not None:
            if size > SMALL_REQUEST:
                return None
            out.append([addr, size, key])
            continue
        for offset in range(0, size, SMALL_REQUEST):
            out.append([addr + offset, min(SMALL_REQUEST, size - offset), None])
    return out


def _carve(seg: tuple, pieces: list[list], keys: _Keys, gaps: list[int]) -> list[tuple]:
    """Ops that rebuild one segment with its live blocks at their native offsets."""
    _, size, stream, small = seg
    ops = []
    if not small:  # one whole-segment request creates the segment at its exact size; small ones
        whole = keys.new()  # are created by their first (<= 1 MiB) piece as a 2 MiB segment
        ops += [(ALLOC, whole, size, stream), (FREE, whole, 0, stream)]
    for _, piece_size, key in pieces:
        if key is None:
            key = keys.new()
            gaps.append((key, stream))
        ops.append((ALLOC, key, piece_size, stream))
    return ops


def _prologue(initial: list[tuple] | None, live: dict[int, tuple[int | None, int, int]]) -> tuple[list, int]:
    """Ops rebuilding the start state, and how many segments were rebuilt block for block.

    live: addr -> (block size or None, requested, stream) of every block live at the start.
    """
    ops: list[tuple] = []
    keys, gaps, placed = _Keys(), [], set()
    starts = [s[0] for s in initial or []]
    by_segment: dict[int, list] = {}
    for addr, (b_size, requested, _) in live.items():
        i = bisect.bisect_right(starts, addr) - 1
        if i >= 0 and addr < starts[i] + initial[i][1]:
            by_segment.setdefault(i, []).append((addr, b_size, requested))
    rebuilt = 0
    # highest address first: the sim backend hands out descending addresses (Note [segment addresses
    # descend] in csrc/backends/sim_backend.cpp), so the rebuilt segments keep their native order
    for i, seg in reversed(list(enumerate(initial or []))):
        pieces = _pieces(seg, sorted(by_segment.get(i, [])))
        if pieces is None:
            continue
        ops += _carve(seg, pieces, keys, gaps)
        placed.update(p[2] for p in pieces if p[2] is not None)
        rebuilt += 1
    for addr in sorted(set(live) - placed):  # blocks we cannot place: allocated the plain way
        b_size, requested, stream = live[addr]
        ops.append((ALLOC, addr, requested or b_size or MIN_BLOCK, stream))
    ops += [(FREE, key, 0, stream) for key, stream in gaps]
    return ops, rebuilt


def _start_state(scan: _Scan, initial: list | None, live: dict, rebuilt: int, unknown_why: str) -> tuple[str, str]:
    """("empty" | "rebuilt" | "unknown", why)."""
    if initial is None:
        return "unknown", unknown_why
    if not initial and not live:
        return "empty", "recording began with nothing allocated or cached"
    if rebuilt < len(initial):
        return "unknown", (f"{len(initial) - rebuilt} of {len(initial)} segments cached at the start have a "
                           "block layout torch's policy could not have made")
    why = (f"{len(initial)} segments ({sum(s[1] for s in initial) / MiB:.0f} MiB) and {len(live)} live blocks "
           "existed when recording began; rebuilt from the final snapshot and the trace's addresses")
    if not scan.segments:
        why += ("; the trace has no segment events, taken to mean the native allocator made none "
                "(every address it touched lies in a segment of the final snapshot)")
    return "rebuilt", why


def _expandable_start(scan: _Scan, live: dict, segments: list[dict]) -> tuple[list | None, str]:
    """Expandable segments: an empty start is provable (nothing live before, and the final mapped
    bytes are what the trace mapped); anything else cannot be rebuilt."""
    mapped = sum(s if a == "segment_map" else -s if a == "segment_unmap" else 0 for _, a, _, s, _ in scan.segments)
    if not live and mapped == sum(s["total_size"] for s in segments):
        return [], ""
    return None, ("expandable segments were already mapped when recording began, and their page layout "
                  "is not in the snapshot")


def _native_untouched(scan: _Scan, segments: list[dict]) -> bool:
    """Whether every address the trace touched lies inside a segment of the final snapshot."""
    spans = sorted((s["address"], s["address"] + s["total_size"]) for s in segments)
    starts = [a for a, _ in spans]
    for addr in scan.allocated | set(scan.orphans):
        i = bisect.bisect_right(starts, addr) - 1
        if i < 0 or addr >= spans[i][1]:
            return False
    return True


def trace_program(snapshot: dict, device: int) -> TraceProgram:
    """One device of a torch (or amem) snapshot as a program, with the native ground truth."""
    traces = snapshot.get("device_traces") or []
    events = traces[device] if device < len(traces) else []
    free_action = "free_completed" if any(e["action"] == "free_completed" for e in events) else "free_requested"
    scan = _scan(events, free_action)
    segments = final_segments(snapshot, device)
    live = {a: (None, req, stream) for a, (req, stream) in scan.orphans.items()}
    live.update(_untraced_blocks(segments, scan))
    initial, why = _initial_segments(segments, scan), ""
    expandable = initial is None
    if expandable:
        initial, why = _expandable_start(scan, live, segments)
    elif not scan.segments and not _native_untouched(scan, segments):
        initial, why = None, ("the trace has no segment events, yet touches addresses outside the final "
                              "segments: segments were made and freed unrecorded")
    prologue, rebuilt = _prologue(initial or [], live)
    start, why = _start_state(scan, initial, live, rebuilt, why)
    n = len(prologue)
    native = Native([(n + i, a, size) for i, a, _, size, _ in scan.segments],
                    sum(s[1] for s in initial or []), expandable,
                    [dict(o, op=o["op"] + n) for o in scan.ooms])
    program = Program(pack(prologue + scan.ops), n, device)
    return TraceProgram(device, program, native, start, why, free_action, len(events), scan.releases)


def trace_programs(snapshot: dict) -> list[TraceProgram]:
    """Every device with events or live blocks."""
    traces = snapshot.get("device_traces") or []
    devices = set(range(len(traces))) | {s.get("device", 0) for s in snapshot.get("segments", [])}
    out = [trace_program(snapshot, d) for d in sorted(devices)]
    return [tp for tp in out if tp.events or tp.program.prologue]


# ============================================================================ running
@dataclass
class Run:
    """One program replayed under one configuration."""

    conf: str
    ops: int
    prologue: int
    allocs: int
    frees: int
    releases: int
    failed_allocs: int      # out of memory (with a device limit)
    unknown_frees: int
    peak_allocated: int
    peak_reserved: int
    allocated_at_peak: int  # the most allocated while reserved stood at its peak
    device_mallocs: int     # segment allocations + page mappings after the prologue
    device_frees: int       # segment frees + page unmappings after the prologue
    timeline: list[tuple[int, int, int]]  # (op index, allocated, reserved)
    seconds: float
    segment_events: list[tuple[str, int]] | None = None  # (action, bytes) after the prologue
    final_segments: list[tuple] | None = None  # (bytes, ((block bytes, active), ...)) at the end
    device_maps: int = 0    # of device_mallocs: page mappings (expandable segments)
    device_unmaps: int = 0  # of device_frees: page unmappings
    peak_requested: int = 0  # the most bytes callers held at once (before rounding), after the prologue

    @property
    def device_calls(self) -> int:
        """cudaMalloc + map + unmap + cudaFree calls after the prologue."""
        return self.device_mallocs + self.device_frees

    @property
    def fragmentation_at_peak(self) -> float:
        return 1 - self.allocated_at_peak / self.peak_reserved if self.peak_reserved else 0.0

    @property
    def ops_per_second(self) -> float:
        return self.ops / self.seconds if self.seconds > 0 else float("inf")

    def to_dict(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k not in ("segment_events", "final_segments")}
        out["fragmentation_at_peak"] = self.fragmentation_at_peak
        return out


def _core(conf: str, limit_bytes: int) -> Any:
    return _C.CoreAllocator("sim", conf, limit_bytes)


def replay_program(program_bytes: bytes, conf: str = "", max_samples: int = 1000, limit_bytes: int = 0) -> dict:
    """The C++ loop on a fresh sim allocator: the core's result dict plus `seconds`, `ops_per_second`
    and the allocator's stats. For benchmark drivers: program_bytes are packed OPS records
    (kinds 0 alloc, 1 free, 2 empty_cache, 3 end of prologue, 4-6 a captured pool's begin, end, release)."""
    core = _core(conf, limit_bytes)
    started = time.perf_counter()
    result = core.replay(program_bytes, max_samples)
    seconds = time.perf_counter() - started
    result.update(seconds=seconds, ops_per_second=result["ops"] / seconds if seconds > 0 else float("inf"),
                  stats=parse_stats(core.stats_json()))
    return result


DEVICE_COUNTERS = ("num_device_alloc", "num_device_free", "num_device_map", "num_device_unmap")


def run(program: Program, conf: str = "", *, limit_bytes: int = 0, max_samples: int = 2000,
        record_segments: bool = False) -> Run:
    """Replays `program` on a fresh sim allocator configured by `conf` (an AMEM_CONF string);
    record_segments also keeps the segment events and the final segment layouts."""
    before = dict.fromkeys(DEVICE_COUNTERS, 0)
    if program.prologue:  # deterministic: the prologue alone tells how many device calls it made
        before = replay_program(program.ops[: program.prologue].tobytes(), conf, 1, limit_bytes)["stats"]
    core = _core(conf, limit_bytes)
    started = time.perf_counter()
    r = core.replay(program.core_bytes(), max_samples, record_segments)
    seconds = time.perf_counter() - started
    stats, frag = parse_stats(core.stats_json()), parse_fragmentation(core.fragmentation_json())
    calls = {k: stats.get(k, 0) - before.get(k, 0) for k in DEVICE_COUNTERS}
    shift = 1 if program.prologue else 0  # the marker op is not one of the program's
    timeline = [(op - shift if op > program.prologue else op, a, b) for op, a, b in r["samples"]]
    out = Run(conf, r["ops"] - shift, program.prologue, r["allocs"], r["frees"], r["releases"], r["failed_allocs"],
              r["unknown_frees"], r["peak_allocated"], r["peak_reserved"], frag.allocated_bytes_at_reserved_peak,
              calls["num_device_alloc"], calls["num_device_free"], timeline, seconds,
              device_maps=calls["num_device_map"], device_unmaps=calls["num_device_unmap"],
              peak_requested=stats.get("requested_bytes.all.peak", 0))
    if record_segments:
        out.segment_events = [(action, size) for _, action, size in r["segment_events"]]
        out.final_segments = segment_layouts(json.loads(core.segments_json()))
    return out


def segment_layouts(segments: list[dict]) -> list[tuple]:
    """Segments as (bytes, ((block bytes, active), ...)): their layout without addresses, comparable
    between a snapshot's `segments` and a replay's."""
    return [(seg["total_size"], tuple((b["size"], b["state"] != "inactive") for b in seg["blocks"]))
            for seg in segments]
