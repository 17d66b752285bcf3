"""Which ranks of a job to record: the first and the last, and every rank only where they differ.

Design note
-----------
Recording is nearly all of a distributed prediction's time, and most jobs are symmetric: under
data parallelism (DDP, FSDP, HSDP), tensor and context parallelism every rank allocates the same
sequence. What breaks symmetry shows at the ends of the rank range: the last rank holds the short
shard of an uneven split and the last pipeline stage (and the first stage is rank 0), rank 0 does
a job's extra work (logging, checkpoints, evaluation on one rank).

So when the user names no ranks (`--rank` absent), the first and the last rank are recorded
together (two processes where the machine has the cores), and:

* if their programs are equal (recording.program_signature), every other rank is taken as the
  first rank's, and the output says which ranks were recorded and why the others were not;
* otherwise every other rank is recorded too (warm workers forked from this process).

`--rank all` records every rank whatever the first and last show; `--rank R,S` records those.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator

from .launch import Launch
from .recording import Recording, record_all


@dataclass
class RankPlan:
    """The recordings made, and the ranks taken as another's without a recording of their own."""
    recordings: list[Recording] = field(default_factory=list)
    taken_as: dict[int, int] = field(default_factory=dict)   # rank -> the recorded rank it is taken as

    @property
    def reason(self) -> str:
        if not self.taken_as:
            return ""
        first, last = self.recordings[0].rank, self.recordings[-1].rank
        return (f"ranks {first} and {last} recorded the same program, so the {len(self.taken_as)} ranks "
                f"between them are taken as rank {first}'s (symmetric: data, tensor or context parallel); "
                "--rank all records each")


def sampled(launch: Launch) -> bool:
    """Whether the job's ranks are chosen by symmetry (no ranks named, more than two in all)."""
    return launch.ranks is None and launch.world_size > 2


def record_ranks(launch: Launch, record: Callable[[int], Recording], workers: int | None = None) -> RankPlan:
    """The chosen ranks recorded: named ones all, else the ends and the rest only where they differ."""
    if not sampled(launch):
        return RankPlan(list(record_all(launch.chosen(), record, workers)))
    last = launch.world_size - 1
    ends = list(record_all([0, last], record, workers, together=True))
    if ends[0].signature == ends[1].signature:
        return RankPlan(ends, {r: 0 for r in range(1, last)})
    middle = list(record_all(list(range(1, last)), record, workers))
    return RankPlan([ends[0], *middle, ends[1]])


def in_rank_order(plan: RankPlan) -> Iterator[tuple[int, Recording | None, int | None]]:
    """(rank, its recording or None, the rank it is taken as or None), every rank in order."""
    recorded = {x.rank: x for x in plan.recordings}
    for rank in sorted([*recorded, *plan.taken_as]):
        yield rank, recorded.get(rank), plan.taken_as.get(rank)
