"""One predicted run as recorded, written by one listener: what every later step reads.

Design note
-----------
While a session runs, the engine tells its listeners of every CUDA allocation (key, stream, what
it is: AllocInfo), every free, every named point (a marker: a step) and every release of the cache
(torch.cuda.empty_cache). One listener, RunRecorder, writes all of it down; the others only react
(the live allocator feeds the sim core so torch.cuda's memory questions are answered mid-run;
stream_uses notes each storage's stream). When the session ends, the engine's final word on what
each storage is (its category, from the Tracer's classifier) replaces the first guess in the same
table, and `finish` hands out a RecordedRun:

    ops       (kind, key, size, stream) in order: the replay program (replay.pack packs it)
    infos     key -> AllocInfo: one table of what each allocation was
    markers   (ops before it, name)
    notes     what the run stood in for, estimated or did not model (notes.py)
    libraries what it initialised (cuBLAS, cuDNN, NCCL) and whether it ran backward: what it
              holds outside the caching allocator follows from them (context.py)

The analysis (analysis/), a distributed job's per-rank comparison (distributed/), the what-ifs and
torch.cuda's snapshot (shims/) all read this one object; nothing records the run a second time.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .. import replay

NOTE = ("PREDICTION without a GPU: the code ran on fake CUDA tensors (no compute); the figures are what "
        "each allocator policy does with the allocations CUDA would have received.")


_POOL_OPS = {"begin": replay.POOL_BEGIN, "end": replay.POOL_END, "release": replay.POOL_RELEASE}


@dataclass
class RecordedRun:
    target: str                                   # what ran: "script train.py --lr 1", a function's name
    ops: list[tuple]                              # (kind, key, size, stream): replay.ALLOC / FREE / RELEASE,
                                                  # and CUDA graphs' pool scopes (POOL_BEGIN / END / RELEASE)
    infos: dict[int, Any]                         # key -> AllocInfo (engine/session.py)
    markers: list[tuple[int, str]]
    notes: list[dict] = field(default_factory=list)
    live_conf: str = ""                           # the policy torch.cuda's live answers used (the trace's)
    autocast_keys: frozenset = frozenset()        # storages autocast's casts made (the verdict shows them)
    seconds: float = 0.0                          # recording, wall time
    libraries: dict = field(default_factory=dict)  # what it initialised: cuda, cublas, cudnn, backward, nccl (context.py)
    compiled_regions: list = field(default_factory=list)   # per torch.compile region traced (engine/compiled.py)

    @property
    def program(self) -> replay.Program:
        return replay.Program(replay.pack(self.ops))

    @property
    def allocations(self) -> int:
        return sum(1 for op in self.ops if op[0] == replay.ALLOC)


class RunRecorder:
    """The listener that writes the run down (see the module's note)."""

    def __init__(self) -> None:
        self.ops: list[tuple[int, int, int, int]] = []
        self.infos: dict[int, Any] = {}
        self.markers: list[tuple[int, str]] = []

    def on_alloc(self, key: int, stream: int, info: Any) -> None:
        self.ops.append((replay.ALLOC, key, int(info.requested), stream))
        self.infos[key] = info

    def on_free(self, key: int) -> None:
        self.ops.append((replay.FREE, key, 0, 0))

    def on_marker(self, name: str) -> None:
        self.markers.append((len(self.ops), name))

    def on_release(self) -> None:
        self.ops.append((replay.RELEASE, 0, 0, 0))

    def on_pool(self, event: str, pool: int) -> None:
        self.ops.append((_POOL_OPS[event], pool, 0, 0))

    def finish(self, target: str, notes: list[dict] | None = None, live_conf: str = "",
               autocast_keys: Any = (), seconds: float = 0.0, libraries: dict | None = None,
               compiled_regions: list | None = None) -> RecordedRun:
        return RecordedRun(target, self.ops, self.infos, list(self.markers), list(notes or []), live_conf,
                           frozenset(autocast_keys), seconds, dict(libraries or {}),
                           [dict(r, graphs=list(r.get("graphs", []))) for r in compiled_regions or []])
