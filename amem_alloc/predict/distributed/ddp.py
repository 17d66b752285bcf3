"""DistributedDataParallel on torch's fake process group.

Design note
-----------
DDP's reducer (torch/csrc/distributed/c10d/reducer.cpp) allocates its buckets itself: one flat
gradient buffer per bucket (`bucket_cap_mb`, 25 MiB by default; the first bucket 1 MiB), into
which gradients are copied as they are ready, or which the gradients *are* with
`gradient_as_bucket_view=True` — all through the dispatcher, so the session records them. Its
default communication hook (comm.cpp `AllReduceCommHook`) all-reduces each bucket in place and
reads the reduced tensor from the work's future; the fake group's future carries no value, so
the reducer stops ("expected the hook result is either a Tensor or a TensorList found None").
`FakeGroupHook` registers, right after DDP's constructor, a hook that allocates what the default
one does — nothing: the all-reduce runs in place on the bucket and divides it in place by the
world size — and hands the bucket back. A script that registers its own comm hook then meets
DDP's "can only be called once" (not modelled).
"""
from __future__ import annotations

from typing import Any


def _allreduce_in_place(group, bucket):  # DDP checks the annotations: set below
    import torch
    import torch.distributed as dist

    buffer = bucket.buffer()
    group = group if group is not None else dist.group.WORLD
    buffer.div_(dist.get_world_size(group))
    dist.all_reduce(buffer, group=group)
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(buffer)
    return future


def _annotate() -> None:
    import torch
    import torch.distributed as dist

    _allreduce_in_place.__annotations__ = {"group": object, "bucket": dist.GradBucket,
                                           "return": torch.futures.Future[torch.Tensor]}


class FakeGroupHook:
    """Context manager: each DDP made while it is active gets the in-place all-reduce hook."""

    def __enter__(self) -> "FakeGroupHook":
        from torch.nn.parallel import DistributedDataParallel as DDP

        self.original = DDP.__init__
        _annotate()

        def init(ddp: Any, *args: Any, **kwargs: Any) -> None:
            self.original(ddp, *args, **kwargs)
            ddp.register_comm_hook(ddp.process_group, _allreduce_in_place)

        DDP.__init__ = init
        return self

    def __exit__(self, *exc: Any) -> None:
        from torch.nn.parallel import DistributedDataParallel as DDP

        DDP.__init__ = self.original
