"""DistributedDataParallel on torch's fake process group.

Design note
-----------
DDP's reducer (torch/csrc/distributed/c10d/reducer.cpp) allocates its buckets itself, in C++: one
flat gradient buffer per bucket (`at::empty` with the parameters' options), from the bucket
assignment DDP's Python computes (`dist._compute_bucket_assignment_by_size`: `bucket_cap_mb`, 25
MiB by default, the first bucket 1 MiB — `_DEFAULT_FIRST_BUCKET_BYTES`). The buckets are made in
the Reducer's constructor and again, in the order gradients became ready, when the reducer
rebuilds them (`_rebuild_buckets`, called from DDP's forward after the first iteration; the old
buckets die then). Gradients are copied into their bucket as they are ready; with
`gradient_as_bucket_view=True` each parameter's `.grad` then *is* a view into its bucket (no copy
of the gradients lives beside the buckets). torch runs all of this; what prediction adds:

* `Reducer` is a pybind class whose `at::empty` names the device only through the parameters'
  options (the meta device under prediction), so nothing tells the Recorder the bucket is CUDA.
  `FakeGroupDDP` puts a subclass in `torch.distributed.Reducer` that runs the constructor and
  `_rebuild_buckets` with the parameters' device as the device its allocations name.
* Its default communication hook (comm.cpp `AllReduceCommHook`) all-reduces each bucket in place
  and reads the reduced tensor from the work's future, which the fake group's C++ default path
  leaves without a value ("expected the hook result is either a Tensor or a TensorList found
  None"). At a DDP's first forward, if the script registered no hook of its own
  (`register_comm_hook`, `_register_builtin_comm_hook`), a hook that allocates what the default
  one does — nothing: the all-reduce runs in place on the bucket and divides it in place by the
  world size — and hands the bucket back is registered. A script's own hook (torch's
  `allreduce_hook`, `fp16_compress_hook` and its half-precision copy of the bucket, or the
  script's) runs instead, reading the reduced tensor from the work's future (collectives.py).
"""
from __future__ import annotations

from typing import Any, Callable

from ...patching import PatchSet, declare, declare_many


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


class _Buckets:
    """Context manager: the reducer's allocations name the parameters' device, and the CUDA
    storages it makes and keeps (its buckets) are gradients (they hold them: the Tracer's category)."""

    def __init__(self, session: Any, device: str, waited: Callable[[], None]) -> None:
        from ..engine.devices import OnDevice as _Device

        self.session, self.device, self.waited = session, _Device(device), waited

    def __enter__(self) -> None:
        self.before = len(self.session.records)
        self.device.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.device.__exit__(*exc)
        self.waited()   # the reducer waited for its broadcasts in C++ (rebuild's bucket indices)
        for key in list(self.session.records)[self.before:]:
            record = self.session.records[key]
            if record.alive:   # its temporaries (rebuild's bucket indices, broadcast) are not buckets
                record.add_role("gradient")


def _reducer_class(original: type, session: Any, waited: Callable[[], None]) -> type:
    """torch's Reducer, allocating its buckets on the device of the parameters it was given."""

    class Reducer(original):   # type: ignore[misc, valid-type]
        def __init__(self, params: Any, *args: Any, **kwargs: Any) -> None:
            self._amem_device = (session.storages.device_of(params[0]) if params else None) or "cuda"
            with _Buckets(session, self._amem_device, waited):
                super().__init__(params, *args, **kwargs)

        def _rebuild_buckets(self) -> bool:
            with _Buckets(session, self._amem_device, waited):
                return super()._rebuild_buckets()

    return Reducer


def _logger_class(original: type) -> type:
    """torch's DDP logger, less its runtime stats: it times iterations with CUDA events on the
    parameters' device, here not a CUDA one to its C++ ('Time stats are currently only collected
    for CPU and CUDA devices', a warning a GPU run never prints)."""

    class Logger(original):   # type: ignore[misc, valid-type]
        def set_runtime_stats_and_log(self) -> None:
            return None

    return Logger


class FakeGroupDDP:
    """Context manager: each DDP made while it is active allocates its buckets on the parameters'
    device and gets the in-place all-reduce hook."""

    def __init__(self, session: Any, waited: Callable[[], None]) -> None:
        self.session, self.waited = session, waited   # waited: the current stream waits for NCCL's

    def __enter__(self) -> "FakeGroupDDP":
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        self.patches = PatchSet()
        self.patches.apply(REDUCER, dist, "Reducer", _reducer_class(dist.Reducer, self.session, self.waited))
        self.patches.apply(LOGGER, dist, "Logger", _logger_class(dist.Logger))
        _annotate()
        for name in ("register_comm_hook", "_register_builtin_comm_hook"):
            self.patches.apply(DDP_HOOKS[name], DDP, name, _noting_hook(getattr(DDP, name)))
        self.patches.apply(DDP_HOOKS["forward"], DDP, "forward", _hooked_at_first_forward(DDP.forward))
        return self

    def __exit__(self, *exc: Any) -> None:
        self.patches.close()


REDUCER = declare("torch.distributed", "Reducer", "DDP's buckets are allocated on the parameters' (fake CUDA) device")
LOGGER = declare("torch.distributed", "Logger", "DDP's logger times no iteration (CUDA events on a fake device)")
DDP_HOOKS = {**declare_many("torch.nn.parallel.DistributedDataParallel", ("register_comm_hook", "_register_builtin_comm_hook"),
                            "notes that the DDP has a comm hook of the script's"),
             "forward": declare("torch.nn.parallel.DistributedDataParallel", "forward",
                                "a DDP with no comm hook of the script's gets the in-place all-reduce at its first forward")}


def _noting_hook(register: Callable) -> Callable:
    """DDP's register_comm_hook (or the built-in form), noting that the DDP has its hook."""
    def wrapped(ddp: Any, *args: Any, **kwargs: Any) -> Any:
        result = register(ddp, *args, **kwargs)
        ddp._amem_has_hook = True
        return result
    return wrapped


def _hooked_at_first_forward(forward: Callable) -> Callable:
    """DDP's forward; at the first, a DDP the script gave no comm hook gets the in-place one."""
    def wrapped(ddp: Any, *args: Any, **kwargs: Any) -> Any:
        if not getattr(ddp, "_amem_has_hook", False):
            ddp.register_comm_hook(ddp.process_group, _allreduce_in_place)
        return forward(ddp, *args, **kwargs)
    return wrapped
