"""Predicting every rank of a distributed job: each rank's script runs under prediction in turn,
on torch's fake process group, and ranks whose recorded programs are equal are analysed once.

Design note
-----------
A rank's run is `api.predicting` (fake CUDA, the live allocator, torch.cuda's stand-ins with
`device_count` = processes per node) around, in this order: the rank's environment
(environment.py), its fake world (process_group.py), NCCL's streams and lifetimes
(collectives.py), then the user's script (script.py: steps and time limits, as for one process).
Ranks run one after another in this process; every process group is destroyed between them.

Most ranks of a data-parallel job allocate the same sequence: their programs are compared (each
op's kind, key, size, and its stream numbered by first use, since stream ids differ between runs)
and a rank equal to an earlier one takes its analysis (`same_as`); only distinct programs go
through the per-policy replay and min-capacity search.
"""
from __future__ import annotations

import hashlib
import time
from typing import Any

from .. import api
from .. import script as script_mod
from .collectives import CollectiveMode, WorkWaits
from .ddp import FakeGroupDDP
from .environment import RankEnvironment
from .launch import Launch
from .per_rank import RankPrediction, RankResult
from .process_group import FakeWorld


def program_signature(ops: list[tuple], markers: list[tuple]) -> str:
    """A digest of a recorded program that is equal for equal allocation sequences."""
    streams: dict[int, int] = {}
    h = hashlib.blake2b(digest_size=16)
    for kind, key, size, stream in ops:
        s = streams.setdefault(stream, len(streams)) if kind == 0 else 0
        h.update(f"{kind},{key},{size},{s};".encode())
    h.update(repr([m for m in markers]).encode())
    return h.hexdigest()


def _analyse(run: Any, seconds: float) -> Any:
    """The per-policy analysis that `predicting` makes on exit (api.py), for a run made without it."""
    from ..outcome import analyse

    infos = dict(run.live.infos)
    infos.update(getattr(run.session, "infos", None) or {})
    return analyse(run.target, run.gpu, run.policies, run.live.ops, infos, run.live.markers,
                   run.live_policy.conf, seconds, notes=run.session.notes.as_list())


def run_rank(launch: Launch, rank: int, script: list[str], gpu: Any, policies: Any, steps: int,
             timeout: float, strict: bool) -> tuple[Any, int, float]:
    """(the finished `predicting` run, optimizer steps made, seconds) of one rank's script."""
    started = time.perf_counter()
    run = api.predicting(gpu, policies=policies, target=f"rank {rank} of {launch.world_size}: {' '.join(script)}",
                         strict=strict, device_count=launch.nproc_per_node, analyse=False)
    with RankEnvironment(launch, rank), run:
        mode = CollectiveMode(run.session)
        with FakeWorld(launch, rank), FakeGroupDDP(run.session, mode.waited), WorkWaits(mode), mode:
            done = script_mod.run(script, run, steps, timeout)
    return run, done, time.perf_counter() - started


def predict_ranks(launch: Launch, script: list[str], gpu: Any, policies: Any, steps: int = script_mod.DEFAULT_STEPS,
                  timeout: float = script_mod.DEFAULT_TIMEOUT, strict: bool = False) -> RankPrediction:
    """Every chosen rank recorded; each distinct program analysed once. Exceptions of a rank's
    script (user_script.ScriptFailed, DataDependentError, NotModelledError, PredictionTimeout)
    go on unchanged."""
    results: list[RankResult] = []
    seen: dict[str, RankResult] = {}
    for rank in launch.chosen():
        run, done, seconds = run_rank(launch, rank, script, gpu, policies, steps, timeout, strict)
        signature = program_signature(run.live.ops, run.live.markers)
        first = seen.get(signature)
        if first is not None:
            results.append(RankResult(rank, first.prediction, same_as=first.rank, steps=done))
            continue
        prediction = _analyse(run, seconds)
        prediction.stopped_after = script_mod.stopped_after_line(done, steps)
        result = RankResult(rank, prediction, same_as=None, steps=done)
        seen[signature] = result
        results.append(result)
    return RankPrediction(launch, results)
