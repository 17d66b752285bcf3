"""A library that keeps per-process state the ways DeepSpeed, accelerate and transformers do: a
module-level singleton (deepspeed/comm/comm.py's `cdb`), a class-wide shared dict (accelerate's
`PartialState._shared_state`), a handler added to its logger at import (deepspeed/utils/logging.py),
an environment variable set at initialisation (accelerate's ACCELERATE_USE_DEEPSPEED), and torch's
`F.linear` replaced for the process (DeepSpeed ZeRO-3's zero3_linear_wrap)."""
import logging
import os

import torch

GROUP = None
logger = logging.getLogger("stateful_library")
logger.addHandler(logging.NullHandler())


class State:
    _shared_state: dict = {}


def init(rank: int) -> None:
    """This process's state, for `rank`; refused when another rank's is here already."""
    global GROUP
    linear = torch.nn.functional.linear
    if GROUP is not None or State._shared_state or "STATEFUL_LIBRARY_RANK" in os.environ \
            or hasattr(linear, "replaced_by_rank"):
        raise RuntimeError(f"rank {rank} found the state of rank {GROUP} ({State._shared_state}, "
                           f"STATEFUL_LIBRARY_RANK={os.environ.get('STATEFUL_LIBRARY_RANK')}, "
                           f"F.linear replaced by rank {getattr(linear, 'replaced_by_rank', None)})")
    GROUP = rank
    State._shared_state["rank"] = rank
    os.environ["STATEFUL_LIBRARY_RANK"] = str(rank)

    def replaced(*args, **kwargs):
        return linear(*args, **kwargs)
    replaced.replaced_by_rank = rank
    torch.nn.functional.linear = replaced
