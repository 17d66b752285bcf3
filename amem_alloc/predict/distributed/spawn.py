"""A job's ranks found in a one-process prediction, and the processes a script spawns run as ranks.

Design note
-----------
Many multi-GPU scripts start their processes themselves instead of under torchrun:
`torch.multiprocessing.spawn(main, args=(world_size, ...), nprocs=world_size)` (pytorch/examples'
DDP tutorial, ImageNet's `--multiprocessing-distributed`), or `start_processes` with another
start method. Process i runs `main(i, *args)`, takes GPU i and joins the process group as a rank.
On a machine with no GPU each such child would stop at its first CUDA call (children.py), and the
script would fail with the children's tracebacks.

Under prediction the spawned processes are the job's ranks, one node of `nprocs` processes:
* in a one-process prediction (`amem predict -- python train.py`), the call stops the run
  (script.SpawnedRanks, a BaseException, so the script's own `except Exception` does not catch it),
  and the command predicts the job again as `--nproc-per-node nprocs` would: ranks.py runs the
  script once per chosen rank, each in its own fake world (the script's code before the spawn
  runs again for each rank, as it does in each real child that imports it). A script that joins
  a process group in a one-process prediction (`init_process_group`, directly or through
  `init_device_mesh`) stops the same way and is predicted as the ranks of its world size (the
  one it names, else WORLD_SIZE, else 1): there is no NCCL without a GPU, and the fake process
  group is the ranks' (process_group.py);
* while a rank runs, the call runs `main(local_rank, *args)` here, in the rank's fake world and
  session, and the rank's run ends when it returns, as the child process does: what the parent
  does after the spawn (wait for the children, read rank 0's results from a queue: Lightning's
  `ddp_spawn`) runs in another process, not the rank's. An exception of `main` is the script's,
  as in the child.
* Lightning (`Trainer(devices=2)`, `Fabric(devices=2)`; the `lightning`, `pytorch_lightning` and
  `lightning_fabric` packages) checks the GPUs it is asked for against the machine's before it
  starts any process: a one-process prediction has one, so Lightning would refuse the job
  ("You requested gpu: [0, 1] But your machine only has: [0]"), which is the machine amem
  predicts on, not the script's fault. Asked for more than one GPU there, the run stops as
  above and is predicted as that many ranks on one node; under torchrun's variables (a rank's
  run) Lightning starts no process of its own (it is "launched externally") and its `ddp_spawn`
  spawn is the one above.
* torchrun's agent started inside the program (`torch.distributed.run.run(args)`, which
  `tune run --nproc_per_node 2 full_finetune_distributed --config ...` calls after resolving the
  recipe and config names to files) would start the ranks as processes of their own, outside the
  prediction. In a one-process prediction the agent's launch stops the run and the job is
  predicted as the ranks it would start, each running the script the agent was given (torchrun's
  nodes and processes per node; an elastic node range or `--no-python` is one line: not modelled).
  Where the agent is given a function (accelerate's `notebook_launcher`), each rank runs the
  script again and, at the launch, the function for that rank, as spawn above. Caught at
  `launch_agent`, which every `elastic_launch` calls, so no agent, store or port is started.
* where `nprocs` is not the launch's processes per node (a script that spawns a fixed number
  under `--nproc-per-node` or torchrun), the rank stops with one line naming the option to give.
"""
from __future__ import annotations

import os
from typing import Any, Callable

from ...patching import PatchSet, declare
from ..notes import NotModelledError, call_site
from ..script import SpawnedRanks, StopPrediction

SPAWN = declare("torch.multiprocessing (and its spawn module)", "spawn, start_processes",
                "the processes a script spawns are the job's ranks: the one-process prediction is made again "
                "per rank (--nproc-per-node), and in a rank the spawned function runs for that rank, in process")
JOIN = declare("torch.distributed, torch.distributed.distributed_c10d, torch.distributed.device_mesh",
               "init_process_group", "in a one-process prediction: the job is predicted again as the ranks of its "
               "world size (each on the fake process group)")

LIGHTNING = declare("lightning.fabric.utilities.device_parser (and lightning_fabric's)", "_sanitize_gpu_ids",
                    "in a one-process prediction, more than one GPU asked of Lightning: the job is predicted again "
                    "as that many ranks on one node")
LIGHTNING_IMPORT = declare("sys", "meta_path", "a copy, first of all finders one that patches Lightning's GPU check "
                           "as its device parser is imported (distributed/spawn.py)")
ELASTIC = declare("torch.distributed.launcher.api", "launch_agent",
                  "torchrun's agent started in process (tune run --nproc_per_node N, accelerate's notebook_launcher): "
                  "a one-process prediction is made again as its ranks; in a rank, a function it was given runs "
                  "for that rank, in process")
LIGHTNING_PARSERS = ("lightning.fabric.utilities.device_parser", "lightning_fabric.utilities.device_parser")


def _processes(n: int) -> str:
    return f"{n} process" + ("" if n == 1 else "es")


def _nprocs(args: tuple, kwargs: dict) -> int:
    """start_processes(fn, args=(), nprocs=1, ...) / spawn(fn, args=(), nprocs=1, ...)."""
    nprocs = kwargs.get("nprocs", args[2] if len(args) > 2 else 1)
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"torch.multiprocessing.spawn: nprocs must be a whole number >= 1, got {nprocs!r}")
    return nprocs


def _stopping_the_run() -> Callable:
    """spawn in a one-process prediction: the run stops, to be predicted again per rank."""
    def start(*args: Any, **kwargs: Any) -> Any:
        n = _nprocs(args, kwargs)
        raise SpawnedRanks(n, f"the script starts {_processes(n)} (torch.multiprocessing.spawn at {call_site(1)})")
    return start


def _joining_a_group() -> Callable:
    """init_process_group in a one-process prediction: the run stops, to be predicted as ranks."""
    def init_process_group(*args: Any, **kwargs: Any) -> None:
        named = kwargs.get("world_size", args[3] if len(args) > 3 else -1)
        n = max(named if isinstance(named, int) and named > 0 else int(os.environ.get("WORLD_SIZE", "1") or 1), 1)
        raise SpawnedRanks(n, f"the script joins a process group of {_processes(n)} (init_process_group at {call_site(1)})")
    return init_process_group


def _asking_lightning(sanitize: Callable) -> Callable:
    """Lightning's check of the GPU ids it is asked for, in a one-process prediction: more than one
    CUDA device stops the run, to be predicted as that many ranks."""
    def sanitize_gpu_ids(gpus: list, include_cuda: bool = False, include_mps: bool = False) -> list:
        if include_cuda and len(gpus) > 1:
            raise SpawnedRanks(len(gpus), f"Lightning is asked for {len(gpus)} GPUs (devices={gpus}, "
                                          f"at {call_site(1)})")
        return sanitize(gpus, include_cuda=include_cuda, include_mps=include_mps)
    return sanitize_gpu_ids


def _launching_the_agent() -> Callable:
    """torch.distributed.launcher.api's launch_agent(config, entrypoint, args) (elastic_launch's
    call, however a program imported it) in a one-process prediction: the run stops, to be
    predicted as the agent's ranks, running its script, or this script again where the agent was
    given a function (notebook_launcher)."""
    def launch_agent(config: Any, entrypoint: Any, args: list, *more: Any, **options: Any) -> Any:
        if config.min_nodes != config.max_nodes:
            raise NotModelledError(f"torchrun started in the program with an elastic node range "
                                   f"({config.min_nodes}:{config.max_nodes}): predict a fixed --nnodes", call_site(1))
        n, nodes = int(config.nproc_per_node), int(config.max_nodes)
        on = f" on {nodes} nodes" if nodes > 1 else ""
        if callable(entrypoint) and not _runs_a_script(entrypoint):
            raise SpawnedRanks(n, f"the program starts torchrun's agent for {_processes(n)} per node{on} running "
                                  f"{getattr(entrypoint, '__name__', 'a function')} (at {call_site(1)})", nnodes=nodes)
        script = _agents_script(entrypoint, list(args))
        runs = " ".join(script[:2]) if script[0] == "-m" else script[0]
        raise SpawnedRanks(n, f"the program starts torchrun's agent for {_processes(n)} per node{on} running "
                              f"{runs} (at {call_site(1)})", nnodes=nodes, script=script)
    return launch_agent


def _runs_a_script(entrypoint: Any) -> bool:
    import torch.distributed.run as torchrun

    return entrypoint is getattr(torchrun, "run_script_path", None)


def _agent_in_the_rank(nproc_per_node: int) -> Callable:
    """launch_agent in a rank's run: a function it was given runs for this rank (the rank's
    variables are torchrun's, as the agent's worker has them), in this process, and the rank's run
    ends with it (as the agent's worker process does)."""
    def launch_agent(config: Any, entrypoint: Any, args: list, *more: Any, **options: Any) -> Any:
        if not callable(entrypoint) or _runs_a_script(entrypoint):
            raise NotModelledError("torchrun's agent started inside a rank's script: predict its script under "
                                   "torchrun instead", call_site(1))
        if int(config.nproc_per_node) != nproc_per_node:
            raise NotModelledError(f"the script starts torchrun's agent for {config.nproc_per_node} processes where "
                                   f"the job has {nproc_per_node} per node: predict it with --nproc-per-node "
                                   f"{config.nproc_per_node}", call_site(1))
        entrypoint(*args)
        raise StopPrediction   # the worker process ends here
    return launch_agent


def _agents_script(entrypoint: Any, args: list[str]) -> list[str]:
    """The script argv of torchrun's command (run.py config_from_args): `python -u [-m] script
    args`, or run_script_path(script, args) for --run-path."""
    import torch.distributed.run as torchrun

    if any(a.startswith("--local-rank=") for a in args):
        raise NotModelledError("torchrun started in the program with --no-use-env (a --local-rank argument per "
                               "process): predict its script under torchrun instead", call_site(2))
    if entrypoint is getattr(torchrun, "run_script_path", None):
        return args
    if isinstance(entrypoint, str) and args[:1] == ["-u"]:
        return args[1:]
    raise NotModelledError(f"torchrun started in the program runs {entrypoint!r}, not a Python script (--no-python)",
                           call_site(2))


def _running_the_rank(local_rank: int, nproc_per_node: int) -> Callable:
    """spawn in a rank's run: the function runs for this rank, in this process."""
    def start(fn: Callable, args: tuple = (), nprocs: int = 1, *more: Any, **kwargs: Any) -> Any:
        n = _nprocs((fn, args, nprocs), {})
        if n != nproc_per_node:
            raise NotModelledError(f"the script spawns {n} processes (torch.multiprocessing.spawn) where the job has "
                                   f"{nproc_per_node} per node: predict it with --nproc-per-node {n}", call_site(1))
        fn(local_rank, *args)
        raise StopPrediction   # the child process ends here: what the parent does next is not this rank's
    return start


class Spawns:
    """Context manager: torch.multiprocessing's spawn and start_processes as above; `rank` None
    (a one-process prediction) stops the run, else the spawned function runs for that rank."""

    def __init__(self, nproc_per_node: int = 1, rank: int | None = None) -> None:
        self.nproc_per_node, self.rank = nproc_per_node, rank
        self.patches = PatchSet()

    def __enter__(self) -> "Spawns":
        import sys

        import torch.multiprocessing as mp

        start = (_stopping_the_run() if self.rank is None
                 else _running_the_rank(self.rank % self.nproc_per_node, self.nproc_per_node))
        module = sys.modules.get("torch.multiprocessing.spawn")
        for owner in (mp, module):
            if owner is not None:
                self.patches.apply(SPAWN, owner, "spawn", start)
                self.patches.apply(SPAWN, owner, "start_processes", start)
        self._agent_is_ranks()
        if self.rank is None:
            self._groups_are_ranks()
            for name in LIGHTNING_PARSERS:
                self.patches.when_imported(LIGHTNING_IMPORT, name, lambda name=name: self._lightning_asks(name))
        return self

    def _agent_is_ranks(self) -> None:
        import torch.distributed as dist

        if dist.is_available():
            import torch.distributed.launcher.api as launcher

            agent = (_launching_the_agent() if self.rank is None
                     else _agent_in_the_rank(self.nproc_per_node))
            self.patches.apply(ELASTIC, launcher, "launch_agent", agent)

    def _lightning_asks(self, name: str) -> None:
        import sys

        parser = sys.modules[name]
        self.patches.apply(LIGHTNING, parser, "_sanitize_gpu_ids", _asking_lightning(parser._sanitize_gpu_ids))

    def _groups_are_ranks(self) -> None:
        import torch.distributed as dist

        if not dist.is_available():
            return
        import torch.distributed.distributed_c10d as c10d
        from .process_group import _binding

        join = _joining_a_group()
        for module in (c10d, dist, *_binding(c10d.init_process_group, "init_process_group", (c10d, dist))):
            self.patches.apply(JOIN, module, "init_process_group", join)

    def __exit__(self, *exc: Any) -> None:
        self.patches.close()
        self.patches = PatchSet()
