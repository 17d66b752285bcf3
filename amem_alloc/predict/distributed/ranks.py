"""Predicting every rank of a distributed job: each rank's script runs under prediction on torch's
fake process group, and ranks whose recorded programs are equal are analysed once.

Design note
-----------
A rank's run is, inside its own fresh libraries (fresh_libraries.py: the script's libraries
imported afresh, as in the new process torchrun would start), `api.predicting` (fake CUDA, the
live allocator, torch.cuda's stand-ins with `device_count` = processes per node) around, in this order: the rank's environment
(environment.py), its fake world (process_group.py), NCCL's streams and lifetimes
(collectives.py), the processes it spawns run as the rank (spawn.py), then the user's script
(script.py: steps and time limits, as for one process).
Every process group is destroyed at the end of a rank. The ranks are recorded in worker processes
forked from this one where the machine has the cores, else one after another here
(recording.py); either way each chosen rank's script runs and its program is recorded.

Which ranks are recorded is symmetry.py's: where the user names none, the first and the last,
and the others only where those two differ. Most ranks of a data-parallel job allocate the same
sequence: the recorded programs are compared (recording.program_signature) and a rank equal to an
earlier one takes its analysis (`same_as`); only distinct programs go through the per-policy
replay and min-capacity search.
"""
from __future__ import annotations

import dataclasses
import functools
import sys
import time
from typing import Any, Callable

from .. import api
from .. import script as script_mod
from ..engine import run_files
from ..engine.saved_files import whole_prediction
from .collectives import CollectiveMode, WorkWaits
from .ddp import FakeGroupDDP
from .environment import RankEnvironment
from .fresh_libraries import FreshLibraries
from .launch import Launch
from .per_rank import RankPrediction, RankResult
from .process_group import FakeWorld
from .recording import Recording
from .spawn import Spawns
from .symmetry import in_rank_order, record_ranks


def _analyse(recording: Recording, gpu: Any, policies: Any) -> Any:
    """The per-policy analysis that `predicting` makes on exit (api.py), of one rank's recording."""
    from ..analysis.prediction import analyse

    return analyse(recording.run, gpu, policies)


def _equal_rank(first: Any, recording: Recording) -> Any:
    """A rank whose program equals an earlier one's: that rank's analysis with its own notes (equal
    programs can read different values: a rank that receives a broadcast stands in for it)."""
    from ..analysis.prediction import shown_notes

    return dataclasses.replace(first, notes=shown_notes(recording.run.notes, first.script_folder))


def run_rank(launch: Launch, rank: int, script: list[str], gpu: Any, policies: Any, steps: int,
             timeout: float, strict: bool, sent: dict | None = None,
             write_repeats: bool = False, shapes: str = "expected") -> tuple[Any, int, float]:
    """(the finished `predicting` run, optimizer steps made, seconds) of one rank's script; `sent`:
    the job's values sent by broadcasts so far (collectives.py), added to by this rank."""
    started = time.perf_counter()
    run = api.predicting(gpu, policies=policies, target=f"rank {rank} of {launch.world_size}: {' '.join(script)}",
                         strict=strict, shapes=shapes, device_count=launch.nproc_per_node, analyse=False)
    try:
        with FreshLibraries(), RankEnvironment(launch, rank), run_files.rank_run(rank), run:
            mode = CollectiveMode(run.session, sent)
            with FakeWorld(launch, rank), FakeGroupDDP(run.session, mode.waited), WorkWaits(mode), mode, \
                    Spawns(launch.nproc_per_node, rank):
                done = script_mod.run(launch.script_for(script, rank), run, steps, timeout, write_repeats)
    except Exception as failed:   # the script's failure or amem's: perhaps on a value another rank sent
        roots = _roots_read(run, rank)
        if roots:
            raise RootsUnread(roots) from failed
        raise
    return run, done, time.perf_counter() - started


class RootsUnread(Exception):
    """A rank's run failed after reading values other ranks broadcast that were unknown to the
    process recording it (`roots`): recorded after them, it may not (roots_first)."""

    def __init__(self, roots: frozenset) -> None:
        super().__init__(f"read what ranks {sorted(roots)} broadcast, unknown here")
        self.roots = roots


def _roots_read(run: Any, rank: int) -> frozenset:
    known = getattr(getattr(run, "session", None), "known", None)
    return frozenset(known.roots_read) - {rank} if known is not None else frozenset()


def record_rank(launch: Launch, rank: int, script: list[str], gpu: Any, policies: Any, steps: int,
                timeout: float, strict: bool, sent: dict | None = None, write_repeats: bool = False,
                shapes: str = "expected") -> Recording:
    """One rank's script run under prediction, as its Recording."""
    run, done, seconds = run_rank(launch, rank, script, gpu, policies, steps, timeout, strict, sent, write_repeats,
                                  shapes)
    run.recorded.seconds = seconds
    return Recording(rank, run.recorded, done, written_out=run.written_out, ended_by=getattr(run, "ended_by", None),
                     backward_steps=getattr(run, "backward_steps", False), roots_read=_roots_read(run, rank))


def roots_first(record: Callable[[int], Recording]) -> Callable[[int], Recording]:
    """`record`, where a rank read values another rank broadcast that were unknown to the process
    recording it (its root was recorded in another worker, or not at all: `--rank 3` alone), made
    again after recording those roots in the same process, so that it reads what they sent
    (Megatron broadcasts from each tensor-parallel group's first rank whether to train at all).
    The roots' own recordings only fill the job's table of values sent (collectives.py). A root
    already recorded in this process sent what it could (a value unknown to it stays unknown:
    recording both again gave nothing and doubled the time of every Lightning DDP job). A rank
    whose script failed after such a read (DeepSpeed ZeRO-3 checks that every rank has rank 0's
    list length: a stand-in 0 fails it) is made again after its roots likewise; where they were
    recorded already, its failure stands."""
    done: set[int] = set()

    def recorded(rank: int, waiting: frozenset = frozenset()) -> Recording:
        try:
            recording = record(rank)
            read = recording.roots_read
        except RootsUnread as unread:
            recording, read = unread, unread.roots
        done.add(rank)
        roots = sorted(read - waiting - {rank} - done)
        if isinstance(recording, RootsUnread):
            if not roots:
                raise recording.__cause__
            print(f"amem predict: rank {rank} failed (above) after reading what rank{'s' if len(roots) > 1 else ''} "
                  f"{', '.join(map(str, roots))} broadcast, unknown to it then; recording it again after "
                  f"{'them' if len(roots) > 1 else 'it'}", file=sys.stderr, flush=True)
        if not roots:
            return recording
        for root in roots:
            recorded(root, waiting | {rank})
        return record(rank)
    return recorded


@whole_prediction()   # what a rank saved from fake tensors, another rank still finds (saved_files.py)
def predict_ranks(launch: Launch, script: list[str], gpu: Any, policies: Any, steps: int = script_mod.DEFAULT_STEPS,
                  timeout: float = script_mod.DEFAULT_TIMEOUT, strict: bool = False,
                  workers: int | None = None, write_repeats: bool = False, shapes: str = "expected") -> RankPrediction:
    """Every chosen rank recorded (in `workers` processes; None: the usable cores); each distinct
    program analysed once. Exceptions of a rank's script (user_script.ScriptFailed,
    DataDependentError, NotModelledError, PredictionTimeout) go on unchanged, the lowest failing
    rank's."""
    gpu, policies = api.resolve_gpu(gpu), api.resolve_policies(policies)
    record = roots_first(functools.partial(record_rank, launch, script=script, gpu=gpu, policies=policies,
                                           steps=steps, timeout=timeout, strict=strict,
                                           sent={},   # the ranks in order: what roots sent
                                           write_repeats=write_repeats, shapes=shapes))
    plan = record_ranks(launch, record, workers)
    results: list[RankResult] = []
    seen: dict[str, RankResult] = {}
    by_rank: dict[int, RankResult] = {}
    for rank, recording, taken_as in in_rank_order(plan):
        if recording is None:   # not recorded: the rank symmetry.py takes it as
            model = by_rank[taken_as]
            results.append(RankResult(rank, model.prediction, same_as=taken_as, steps=model.steps, recorded=False))
            continue
        first = seen.get(recording.signature)
        if first is not None:
            result = RankResult(recording.rank, _equal_rank(first.prediction, recording), same_as=first.rank,
                                steps=recording.steps, recording_s=recording.seconds)
            results.append(result)
            by_rank[rank] = result
            continue
        prediction = _analyse(recording, gpu, policies)
        prediction.stopped_after = script_mod.stopped_after_line(recording.steps, steps, recording.written_out,
                                                                 recording.ended_by, recording.backward_steps)
        result = RankResult(recording.rank, prediction, same_as=None, steps=recording.steps,
                            recording_s=recording.seconds)
        seen[recording.signature] = result
        results.append(result)
        by_rank[rank] = result
    return RankPrediction(launch, results, plan.reason)
