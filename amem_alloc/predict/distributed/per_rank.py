"""The answer per rank: each rank's prediction (or the rank whose recorded program it equals), the
worst rank, side by side in text and in JSON (`"ranks": [...]`), one trace per rank.

Design note
-----------
A rank's figures are a `Prediction` (analysis/prediction.py) like a single process's. The worst rank is the
one that needs the most memory under the first policy asked (its min capacity, then its peak
reserved): on a job whose ranks differ (uneven shards, pipeline stages, rank 0's extra work) it is
the rank that decides whether the job fits. `--trace` takes a path with `{rank}` in it and writes
one snapshot per rank (equal ranks get the same file content under their own names).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..analysis.prediction import NOTE, Prediction
from .launch import Launch

RANK_FIELD = "{rank}"


@dataclass
class RankResult:
    rank: int
    prediction: Prediction
    same_as: int | None = None      # an earlier rank with an equal recorded program
    steps: int = 0
    recording_s: float = 0.0       # the rank's recording, wall time (its own, equal or not)
    recorded: bool = True          # False: taken as `same_as` by symmetry, not recorded (symmetry.py)


@dataclass
class RankPrediction:
    launch: Launch
    ranks: list[RankResult] = field(default_factory=list)
    not_recorded_because: str = ""   # why some ranks were taken as another's (symmetry.py)

    def rank(self, r: int) -> RankResult:
        return next(x for x in self.ranks if x.rank == r)

    @property
    def worst(self) -> RankResult:
        def need(x: RankResult) -> tuple[int, int]:
            row = x.prediction.rows[0]
            return (row.min_capacity, row.peak_reserved)
        return max(self.ranks, key=need)

    def distinct(self) -> list[RankResult]:
        return [x for x in self.ranks if x.same_as is None]

    # ---------------------------------------------------------------- JSON
    def to_dict(self) -> dict:
        first = self.ranks[0].prediction.to_dict()
        out = {"predicted": True, "note": NOTE, "gpu": first["gpu"],
               "world_size": self.launch.world_size, "nproc_per_node": self.launch.nproc_per_node,
               "nnodes": self.launch.nnodes, "worst_rank": self.worst.rank,
               "not_recorded_because": self.not_recorded_because, "ranks": []}
        for x in self.ranks:
            entry = {"rank": x.rank, "same_as": x.same_as, "recorded": x.recorded, "steps": x.steps}
            entry.update({k: v for k, v in x.prediction.to_dict().items() if k not in ("gpu", "note", "predicted")})
            out["ranks"].append(entry)
        return out

    def write_json(self, path: str | Path) -> Path:
        from ...atomic_write import write_text

        return write_text(path, json.dumps(self.to_dict(), indent=1))

    # ---------------------------------------------------------------- traces and report
    def write_traces(self, path: str) -> list[Path]:
        if RANK_FIELD not in path and len(self.ranks) > 1:
            raise ValueError(f"--trace {path}: put {RANK_FIELD} in the path for one file per rank "
                             f"(e.g. trace_rank{RANK_FIELD}.pickle)")
        return [x.prediction.write_trace(path.replace(RANK_FIELD, str(x.rank))) for x in self.ranks]

    def rank_snapshots(self) -> list[tuple[int, dict]]:
        """Every rank's predicted snapshot, for the ranks' page (equal ranks' built once)."""
        built: dict[int, dict] = {}
        out = []
        for x in self.ranks:
            key = x.prediction.run_key()
            if key not in built:
                built[key] = x.prediction.snapshot()
            out.append((x.rank, built[key]))
        return out
