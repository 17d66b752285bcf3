"""Object collectives on the fake process group: each rank answers with its own objects.

Design note
-----------
torch's object collectives (torch/distributed/distributed_c10d.py: `broadcast_object_list`,
`all_gather_object`, `gather_object`) pickle each object into a byte tensor and send its size, then
its bytes, by tensor collectives. The fake group moves no data, so a receiving rank reads sizes it
never received: `broadcast_object_list` on a rank other than the source sizes its buffer from an
uninitialised `torch.empty` (PyTorch Lightning's DDP strategy broadcasts its log folder this way
and died asking the CPU for 94 TB), and `all_gather_object` unpickles zero bytes.

Ranks are recorded apart and never see each other's objects, so each rank answers from its own:
a rank that receives a broadcast keeps the list it passed in (Lightning, like most callers,
passes the value every rank computed alike), `all_gather_object` fills every slot with this
rank's object and `gather_object` does so on the destination. Each answer is noted as a stand-in.
Code that merges what it gathered and checks that it covers the whole (FSDP1's optimizer state
dict, a distributed checkpoint's save plan) fails on it: an error raised in the innermost library
frames that were handed the answer ends the run as not modelled, not as the script's failure
(engine/values.py `handed_to`).
The source rank's broadcast runs torch's own code. Not counted: the small staging tensors that
NCCL's object collectives put on the GPU (the pickled bytes and their sizes, freed at once).

`ZeroRedundancyOptimizer.consolidate_state_dict(to)` gathers each rank's shard of the optimizer
state on rank `to` by an object broadcast of its own (zero_redundancy_optimizer.py's
`_broadcast_object`), which unpickled zero bytes there ("EOFError: Ran out of input"). A receiving
rank gets a stand-in of the source's shard: its parameter groups as the source's optimizer
numbers them, without state entries (the consolidated state lives on the CPU: the GPU's memory is
the same; not counted are the receive buffers the bytes would pass through on the GPU). Noted.
"""
from __future__ import annotations

from typing import Any

from .. import notes
from ..engine import run_files, values

FUNCTIONS = ("broadcast_object_list", "all_gather_object", "gather_object")
GATHERED = "what torch.distributed.{function} gathered from every rank (here: this rank's own objects, each time)"
ZERO_NOTE = ("ZeroRedundancyOptimizer.consolidate_state_dict: other ranks' shards of the optimizer state are their "
             "parameter groups without state (the fake process group carries no values between ranks; the "
             "consolidated state is host memory)")


def _rank_in(group: Any) -> int:
    import torch.distributed.distributed_c10d as c10d

    return c10d.get_rank(c10d._group_or_default_group(group))


def _group_rank(group: Any, global_rank: int | None, group_rank: int | None) -> int:
    import torch.distributed.distributed_c10d as c10d

    if global_rank is None and group_rank is None:
        global_rank = 0
    return c10d._canonicalize_group_rank(c10d._group_or_default_group(group), global_rank, group_rank)


def _stand_in(function: str) -> None:
    notes.record(notes.STAND_IN, f"torch.distributed.{function}: this rank's own objects (the fake process "
                 "group carries no values between ranks)")


def replacements(originals: dict[str, Any]) -> dict[str, Any]:
    """The object collectives answering from this rank, given torch's (by name, FUNCTIONS)."""
    def broadcast_object_list(object_list: list, src: int | None = None, group: Any = None, device: Any = None,
                              group_src: int | None = None, **kwargs: Any) -> None:
        if _rank_in(group) == _group_rank(group, src, group_src):
            return originals["broadcast_object_list"](object_list, src, group, device, group_src, **kwargs)
        _stand_in("broadcast_object_list")
        run_files.synced(2)   # torch's two broadcasts (the sizes, then the bytes), as the source makes them
        return None

    def all_gather_object(object_list: list, obj: Any, group: Any = None, **kwargs: Any) -> None:
        _stand_in("all_gather_object")
        values.handed_to(GATHERED.format(function="all_gather_object"))
        object_list[:] = [obj] * len(object_list)

    def gather_object(obj: Any, object_gather_list: list | None = None, dst: int | None = None, group: Any = None,
                      group_dst: int | None = None, **kwargs: Any) -> None:
        if _rank_in(group) == _group_rank(group, dst, group_dst) and object_gather_list is not None:
            _stand_in("gather_object")
            values.handed_to(GATHERED.format(function="gather_object"))
            object_gather_list[:] = [obj] * len(object_gather_list)

    return {"broadcast_object_list": broadcast_object_list, "all_gather_object": all_gather_object,
            "gather_object": gather_object}


def zero_replacements(zero: Any) -> dict[str, Any]:
    """ZeroRedundancyOptimizer's `consolidate_state_dict` (which optimizer consolidates) and the
    module's `_broadcast_object` (a receiving rank's stand-in), given the module `zero`."""
    consolidating: list = []
    consolidate, broadcast = zero.ZeroRedundancyOptimizer.consolidate_state_dict, zero._broadcast_object

    def consolidate_state_dict(self: Any, *args: Any, **kwargs: Any) -> None:
        consolidating.append(self)
        try:
            return consolidate(self, *args, **kwargs)
        finally:
            consolidating.pop()

    def _broadcast_object(obj: Any, src_rank: int, *args: Any, **kwargs: Any) -> Any:
        import torch.distributed as dist

        if dist.get_rank() == src_rank or not consolidating:
            return broadcast(obj, src_rank, *args, **kwargs)
        group = kwargs.get("group", args[0] if args else None)
        notes.record(notes.STAND_IN, ZERO_NOTE)
        return _shard_without_state(consolidating[-1], dist.get_group_rank(group or dist.group.WORLD, src_rank))

    return {"consolidate_state_dict": consolidate_state_dict, "_broadcast_object": _broadcast_object}


def _shard_without_state(optimizer: Any, group_rank: int) -> dict:
    """The state_dict the optimizer's shard on `group_rank` would send, less its state: its parameter
    groups, their parameters numbered as torch.optim numbers them (from 0, group after group)."""
    groups, first = [], 0
    for group in optimizer._partition_parameters()[group_rank]:
        count = len(group["params"])
        settings = {k: v for k, v in group.items() if k != "params"}
        groups.append({**settings, "params": list(range(first, first + count))})
        first += count
    return {"state": {}, "param_groups": groups}
