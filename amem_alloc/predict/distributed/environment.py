"""What torchrun (or DeepSpeed's launcher) gives each process, set for one rank while it runs under
prediction.

Design note
-----------
torchrun's elastic agent (torch/distributed/elastic/agent/server/local_elastic_agent.py,
`_start_workers`) sets these for each worker; a script reads them directly or through
`init_process_group("env://")`. They are set in os.environ for the rank's run and restored after
it (values that were there before come back; names that were not are removed).
"""
from __future__ import annotations

import os
from typing import Any

from ...patching import PatchSet, declare
from .launch import Launch

TORCHRUN_VARIABLES = declare("os.environ", "torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, ...), "
                             "or DeepSpeed's launcher's (its LOCAL_SIZE, CROSS_RANK, CROSS_SIZE)",
                             "each in-process rank sees the environment torchrun would give it")


def rank_variables(launch: Launch, rank: int) -> dict[str, str]:
    return {**dict(launch.env), **_launcher_variables(launch, rank)}


def _launcher_variables(launch: Launch, rank: int) -> dict[str, str]:
    local = rank % launch.nproc_per_node
    node = rank // launch.nproc_per_node
    if launch.launcher == "deepspeed":   # deepspeed/launcher/launch.py's
        return {"RANK": str(rank), "LOCAL_RANK": str(local), "WORLD_SIZE": str(launch.world_size),
                "LOCAL_SIZE": str(launch.nproc_per_node), "CROSS_RANK": str(node), "CROSS_SIZE": str(launch.nnodes),
                "MASTER_ADDR": launch.master_addr, "MASTER_PORT": str(launch.master_port)}
    return {"RANK": str(rank), "LOCAL_RANK": str(local), "WORLD_SIZE": str(launch.world_size),
            "LOCAL_WORLD_SIZE": str(launch.nproc_per_node), "GROUP_RANK": str(node), "NODE_RANK": str(node),
            "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(launch.world_size), "ROLE_NAME": "default",
            "GROUP_WORLD_SIZE": str(launch.nnodes), "MASTER_ADDR": launch.master_addr,
            "MASTER_PORT": str(launch.master_port), "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "amem-predict",
            "TORCHELASTIC_USE_AGENT_STORE": "False", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}


class RankEnvironment:
    """Context manager: os.environ as torchrun sets it for `rank`, restored on exit."""

    def __init__(self, launch: Launch, rank: int) -> None:
        self.values = rank_variables(launch, rank)
        self.patches = PatchSet()

    def __enter__(self) -> "RankEnvironment":
        for name, value in self.values.items():
            self.patches.setenv(TORCHRUN_VARIABLES, name, value)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.patches.close()
        self.patches = PatchSet()
