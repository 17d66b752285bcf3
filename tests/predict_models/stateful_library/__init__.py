"""A library that keeps per-process state the ways DeepSpeed, accelerate and transformers do: a
module-level singleton (deepspeed/comm/comm.py's `cdb`), a class-wide shared dict (accelerate's
`PartialState._shared_state`), a handler added to its logger at import (deepspeed/utils/logging.py),
an environment variable set at initialisation (accelerate's ACCELERATE_USE_DEEPSPEED)."""
import logging
import os

GROUP = None
logger = logging.getLogger("stateful_library")
logger.addHandler(logging.NullHandler())


class State:
    _shared_state: dict = {}


def init(rank: int) -> None:
    """This process's state, for `rank`; refused when another rank's is here already."""
    global GROUP
    if GROUP is not None or State._shared_state or "STATEFUL_LIBRARY_RANK" in os.environ:
        raise RuntimeError(f"rank {rank} found the state of rank {GROUP} ({State._shared_state}, "
                           f"STATEFUL_LIBRARY_RANK={os.environ.get('STATEFUL_LIBRARY_RANK')})")
    GROUP = rank
    State._shared_state["rank"] = rank
    os.environ["STATEFUL_LIBRARY_RANK"] = str(rank)
