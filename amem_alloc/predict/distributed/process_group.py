"""init_process_group and init_device_mesh on torch's own fake process group, for one rank.

Design note
-----------
torch ships a process group that needs no network and no GPU:
torch/testing/_internal/distributed/fake_pg.py registers the backend "fake" (C++
`FakeProcessGroup`) with a `FakeStore`; every collective returns at once without moving data,
which is all prediction needs (it computes no values). While a rank runs, `FakeWorld` makes
`torch.distributed.init_process_group(backend, ...)` create that group whatever backend the
script names ("nccl", "cuda:nccl,cpu:gloo", None), with the rank and world size of the launch;
DeviceMesh, DTensor, DDP and FSDP then run their real code on it.

Two answers a GPU machine gives are given too while the rank runs, restored after:
* `torch._C._get_accelerator()` is CUDA (fully_shard's default mesh and torch.accelerator ask it);
* `torch.meta` is `torch.cuda`: inside an op, and in saved-tensor unpack hooks, fake tensors show
  their real device ("meta", execution.unspoofed), and FSDP/DeviceMesh look up a device's module by its type name
  (`getattr(torch, device.type)`) to reach its streams and events.
DDP's `_verify_params_across_processes` (C++) all-gathers the parameters' shapes and compares the
values; the fake group carries no values, so the check is skipped (every rank runs the same script).
For the same reason the object collectives answer from the rank's own objects (object_collectives.py).
At the end of the rank every process group is destroyed, so the next rank starts from none (and
from fresh libraries: fresh_libraries.py). The communicators NCCL would hold are counted then, or
when the script destroys its groups itself, whichever comes first.

FSDP1 (`FullyShardedDataParallel`, flat parameters) runs its own code too: flat parameters made,
sharded, all-gathered on its unshard stream (refilled with `resize_` through torch/distributed/
utils.py's `_alloc_storage`), freed with `record_stream` on the compute stream, gradients
reduce-scattered on its post-backward stream, its `limit_all_gathers` rate limiter blocking on
events (shims/devices.FakeEvent, stream_uses.py). Its hooks in backward check the flat parameter's
device against the compute device: backward's hooks see CUDA devices as forward's code does
(session.py, execution.unspoofed). CPU offload (`CPUOffload(offload_params=True)`) is refused
(NotModelledError, exit 4): its gradients, made on the GPU, are assigned to the CPU flat
parameter's `.grad`, which torch refuses for a fake tensor ("attempting to assign a gradient with
device type 'cpu' to a tensor with device type 'meta'").
"""
from __future__ import annotations

from typing import Any

from ...patching import PatchSet, declare, declare_many
from .. import notes
from ..engine import run_files
from . import barrier, object_collectives
from .launch import Launch

FAKE = "fake"
INIT_PROCESS_GROUP = declare("torch.distributed, torch.distributed.distributed_c10d, torch.distributed.device_mesh",
                             "init_process_group",
                             "every process group is torch's fake one (no network), for this rank of the launch")
OBJECT_COLLECTIVES = declare_many("torch.distributed, torch.distributed.distributed_c10d", object_collectives.FUNCTIONS,
                                  "object collectives answer from the rank's own objects (object_collectives.py)")
ZERO_CONSOLIDATE = declare("torch.distributed.optim.ZeroRedundancyOptimizer", "consolidate_state_dict",
                           "which optimizer consolidates, for its receiving ranks' stand-ins (object_collectives.py)")
ZERO_BROADCAST = declare("torch.distributed.optim.zero_redundancy_optimizer", "_broadcast_object",
                         "a rank receiving another's optimizer shard gets a stand-in (object_collectives.py)")
ACCELERATOR = declare("torch._C", "_get_accelerator", "the accelerator is CUDA (torch asks the C++ runtime)")
VERIFY_PARAMS = declare("torch.distributed", "_verify_params_across_processes",
                        "DDP's check of parameter shapes across ranks: nothing to compare with one rank at a time")
TORCH_META = declare("torch", "meta", "torch.meta (what torch.get_device_module(\"meta\") finds) answers as torch.cuda")
NEW_GROUP = declare("torch.distributed, torch.distributed.distributed_c10d", "new_group",
                    "a new group is the fake one too, whatever backend is named (Megatron's gloo groups: "
                    "gloo would be built on the fake store, which crashes the process)")
DESTROY_PROCESS_GROUP = declare("torch.distributed, torch.distributed.distributed_c10d", "destroy_process_group",
                                "the communicators NCCL would hold are counted before a script destroys its groups")
FSDP1_INIT = declare("torch.distributed.fsdp.FullyShardedDataParallel", "__init__",
                     "FSDP1 with CPU offload is refused with one line (not modelled)")


FSDP1_OFFLOAD_REFUSED = ("FSDP1 (FullyShardedDataParallel) with CPUOffload(offload_params=True) is not modelled "
                         "under prediction; FSDP2's fully_shard with CPUOffloadPolicy is")


def _refusing_cpu_offload(init: Any) -> Any:
    """FullyShardedDataParallel.__init__, refusing what prediction cannot run (see above)."""
    def __init__(fsdp: Any, *args: Any, **kwargs: Any) -> None:   # args: module, process_group, ...
        offload = kwargs.get("cpu_offload", args[3] if len(args) > 3 else None)
        if getattr(offload, "offload_params", False):
            raise notes.NotModelledError(FSDP1_OFFLOAD_REFUSED)
        init(fsdp, *args, **kwargs)
    return __init__


def _on_the_default_backend(new_group: Any) -> Any:
    """dist.new_group with the default group's backend (the fake one) whatever backend is named,
    and without a backend's options (NCCL's) or a device to bind."""
    import inspect

    signature = inspect.signature(new_group)

    def on_fake(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        for name in ("backend", "pg_options", "device_id"):
            if name in bound.arguments:
                bound.arguments[name] = None
        return new_group(*bound.args, **bound.kwargs)
    return on_fake


def _binding(function: Any, name: str, done: tuple) -> list:
    """torch.distributed's modules, other than `done`, that bound `function` under `name` when they
    were imported (torch.distributed.device_mesh calls init_process_group by its own name: a
    script that makes its mesh with init_device_mesh and no init_process_group reaches it there)."""
    import importlib
    import sys

    importlib.import_module("torch.distributed.device_mesh")
    return [m for key, m in list(sys.modules.items())
            if key.startswith("torch.distributed") and m is not None and m not in done
            and getattr(m, name, None) is function]


def nccl_groups(backend: Any) -> int:
    """How many NCCL communicators the rank's process groups would have made: one per group (the
    default one, new_group's, a DeviceMesh's dimensions), when the script's backend is NCCL (None:
    torch's default for CUDA tensors)."""
    import torch.distributed.distributed_c10d as c10d

    if backend is not None and "nccl" not in str(backend).lower():
        return 0
    return len(getattr(c10d._world, "pg_map", {}) or {})


class FakeWorld:
    """Context manager: the rank's process groups are torch's fake process group."""

    def __init__(self, launch: Launch, rank: int) -> None:
        self.launch, self.rank = launch, rank
        self.patches = PatchSet()
        self.backend: Any = None   # the backend the script asked for (a GPU job's NCCL: None or "nccl")

    def __enter__(self) -> "FakeWorld":
        import torch
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d
        import torch.testing._internal.distributed.fake_pg  # noqa: F401 - registers the "fake" backend

        original = c10d.init_process_group
        world = self

        def init_process_group(backend: Any = None, init_method: Any = None, timeout: Any = None,
                               world_size: int = -1, rank: int = -1, store: Any = None, **kwargs: Any) -> None:
            from torch.testing._internal.distributed.fake_pg import FakeStore   # torch 2.11 has it only here

            if backend not in (None, FAKE):
                notes.record(notes.NOT_MODELLED, f"init_process_group({backend!r}): torch's fake process group "
                             "(no communication; NCCL's memory outside the caching allocator is in the device "
                             "total's breakdown, its buffers per peer are not)")
            kwargs.pop("device_id", None)   # binds a real CUDA device (eager NCCL init): nothing to bind
            world.backend = backend
            if timeout is not None:
                kwargs["timeout"] = timeout
            made = original(FAKE, world_size=world.launch.world_size, rank=world.rank, store=FakeStore(), **kwargs)
            run_files.synced(barrier=True)   # the store's rendezvous: every rank has started (run_files.py)
            return made

        destroy = c10d.destroy_process_group

        def destroy_process_group(*args: Any, **kwargs: Any) -> None:
            world._count_nccl_groups()   # (nanoGPT destroys its group itself, at the end)
            return destroy(*args, **kwargs)

        new_group = _on_the_default_backend(c10d.new_group)
        objects = object_collectives.replacements({name: getattr(c10d, name) for name in object_collectives.FUNCTIONS})
        for module in (c10d, dist):
            self.patches.apply(INIT_PROCESS_GROUP, module, "init_process_group", init_process_group)
            self.patches.apply(DESTROY_PROCESS_GROUP, module, "destroy_process_group", destroy_process_group)
            self.patches.apply(NEW_GROUP, module, "new_group", new_group)
            for name, function in objects.items():
                self.patches.apply(OBJECT_COLLECTIVES[name], module, name, function)
        for module in _binding(original, "init_process_group", (c10d, dist)):   # init_device_mesh's own name
            self.patches.apply(INIT_PROCESS_GROUP, module, "init_process_group", init_process_group)
        self.patches.apply(ACCELERATOR, torch._C, "_get_accelerator", lambda: torch.device("cuda"))
        barrier.install(self.patches, (dist, c10d), lambda ids: ids is not None or self.backend in (None, "nccl"))
        self.patches.apply(VERIFY_PARAMS, dist, "_verify_params_across_processes", lambda *args, **kwargs: None)
        self._zero_consolidation()
        self.patches.apply(TORCH_META, torch, "meta", torch.cuda)
        from torch.distributed.fsdp import FullyShardedDataParallel

        self.patches.apply(FSDP1_INIT, FullyShardedDataParallel, "__init__",
                           _refusing_cpu_offload(FullyShardedDataParallel.__init__))
        return self

    def _zero_consolidation(self) -> None:
        import torch.distributed.optim.zero_redundancy_optimizer as zero

        replaced = object_collectives.zero_replacements(zero)
        self.patches.apply(ZERO_CONSOLIDATE, zero.ZeroRedundancyOptimizer, "consolidate_state_dict",
                           replaced["consolidate_state_dict"])
        self.patches.apply(ZERO_BROADCAST, zero, "_broadcast_object", replaced["_broadcast_object"])

    def _count_nccl_groups(self) -> None:
        """The session hears how many communicators NCCL would hold (predict/context.py)."""
        from .. import state

        st = state.current()
        groups = nccl_groups(self.backend)
        if st is not None and groups and hasattr(st.session, "uses"):
            st.session.uses("nccl", groups)

    def __exit__(self, *exc: Any) -> None:
        import torch.distributed as dist

        try:
            if dist.is_initialized():
                self._count_nccl_groups()
                dist.destroy_process_group()
        finally:
            self.patches.close()
            self.patches = PatchSet()
