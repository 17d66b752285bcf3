"""What collectives allocate and hold on the CUDA caching allocator, as ProcessGroupNCCL does, on
torch's fake process group.

Design note
-----------
The fake process group (process_group.py) moves no data and allocates nothing; c10d's ops and
torch's functional collectives still run through the dispatcher with the session's fake CUDA
tensors, so their outputs are allocated by the session's Recorder like any op's (a functional
all-gather's output, an `all_to_all_single` output). `CollectiveMode`, a dispatch mode entered
above the Recorder, adds what ProcessGroupNCCL does beyond that
(torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, `collective()` / `pointToPoint()`):

* A synchronous op (`async_op=False`) runs on the current stream and holds nothing.
* An asynchronous op (`async_op=True`, every functional collective) runs on the process group's
  NCCL stream and keeps its inputs and outputs alive until the work is waited for
  (`stashed_for_allocator_safety_`; older releases used `recordStream` on the NCCL stream, with
  `TORCH_NCCL_AVOID_RECORD_STREAMS=1` stashing instead — the same lifetime either way). Here each
  such tensor is recorded as used on the group's NCCL stream (stream_uses.py), so a free before
  the wait is held until `work.wait()` / `wait_tensor` makes the current stream wait for it.
* A work's future holds the op's outputs, as NCCL's (`fut.value()[0]` is the reduced tensor: a
  DDP comm hook such as torch's `allreduce_hook` reads it); the fake group's holds nothing.
* The coalesced forms (`allreduce_coalesced_`, `allgather_into_tensor_coalesced_`,
  `reduce_scatter_tensor_coalesced_`: `dist._coalescing_manager`) write into the tensors given,
  allocate nothing and return a work (torch registers no meta kernel for them: answered here).
* Point-to-point ops (`send`, `recv_`: `isend`/`irecv`/`batch_isend_irecv`) always return a work
  and keep their tensors for NCCL the same way until it is waited (`pointToPoint()`).
* `wait_tensor` returns its input (torch/csrc/distributed/c10d/Functional.cpp), and
  `_wrap_tensor_autograd` wraps its input in an AsyncCollectiveTensor, whose first use calls
  wait_tensor: both are answered so here, where their meta kernels would make a new tensor
  (`empty_like`) and nothing would ever wait (the collective's held frees would last to the end).
* The list forms flatten: `allgather` into a list of tensors gathers into one flat buffer of
  world x input bytes, then copies out; `reduce_scatter` of a list copies the inputs into one flat
  buffer of world x output bytes (`newLikeFlat`). The buffer lives for the call.

Values, where they are known (engine/known.py: small tensors made from known data). A broadcast
delivers the root's values, which the fake group does not carry; libraries read them to check that
the ranks agree (DeepSpeed ZeRO-3 broadcasts rank 0's list of module ids, where the other ranks
put -1, and compares: deepspeed/runtime/zero/utils.py `assert_ints_same_as_other_ranks`). The
ranks of a job are recorded in order, and a rank recorded later in this process (or in a worker
forked after it) is given what an earlier root sent: the job's `sent` table keeps the known values
each broadcast's root sent, by process group and the broadcast's number on it (every rank runs the
same script, so their n-th broadcasts on a group match). A receiving rank whose root has not been
recorded before it (`--rank 1` alone; a root of higher rank) has unknown values there: a read gets a
stand-in and a note. An all-gather into one tensor (`all_gather_into_tensor`, the functional
`all_gather_tensor`) of known values gives every rank's slot this rank's value: the ranks run one
program (accelerate gathers each rank's tensor sizes so, to pad them to the largest).
Not modelled: NCCL's own device memory (its channels, buffers and user-buffer registration live
outside the caching allocator: cudaMalloc or cuMem by NCCL itself) and `TORCH_NCCL_*` tuning.
"""
from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ...patching import PatchSet, declare
from ..engine import run_files, stream_uses

_c10d = torch.ops.c10d
_functional = torch.ops._c10d_functional
_LIST_FLATTENS = {_c10d.allgather_.default: "output", _c10d.reduce_scatter_.default: "input"}
_POINT_TO_POINT = {_c10d.send.default, _c10d.recv_.default, _c10d.recv_any_source_.default}
# The coalesced forms (dist._coalescing_manager's fast path, Megatron's gradient buckets) write
# into tensors they are given and return a work; torch registers no meta kernel for them.
_COALESCED = {getattr(_c10d, name).default for name in
              ("allreduce_coalesced_", "allgather_into_tensor_coalesced_", "reduce_scatter_tensor_coalesced_")
              if hasattr(_c10d, name)}
# torch/distributed/_functional_collectives.py: a custom op whose CUDA result wraps its input
# (registered when that module is imported, so known by name)
_WRAP_TENSOR_AUTOGRAD = "_c10d_functional::_wrap_tensor_autograd"


def _tensors(value: Any) -> list[torch.Tensor]:
    out = []
    for v in value if isinstance(value, (list, tuple)) else (value,):
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(_tensors(v))
    return out


SHARED_DEVICE = ("local rank {rank} makes its collectives on cuda:0, the device of local rank 0 too (the script "
                 "sets no device for its rank): NCCL refuses two ranks of a node on one GPU (\"Duplicate GPU "
                 "detected\"), and where they ran they would share its memory; predicted as if each rank had a GPU of "
                 "its own. Call torch.cuda.set_device(int(os.environ[\"LOCAL_RANK\"])) before the first collective")


def _note_a_shared_device() -> None:
    """The first collective of a rank other than its node's first, made on cuda:0: that rank and
    local rank 0 would share one GPU (pytorch/examples' imagenet under torchrun without --gpu)."""
    import os

    from .. import notes
    from ..engine.devices import cuda_index

    try:
        local = int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError:
        return
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    one_visible = visible is not None and "," not in visible   # (a launcher that gives each rank its own GPU)
    if local > 0 and cuda_index() == 0 and not one_visible:
        notes.record(notes.NOT_MODELLED, SHARED_DEVICE.format(rank=local))


class CollectiveMode(TorchDispatchMode):
    """Dispatch mode: NCCL's streams and lifetimes for c10d ops and functional collectives."""

    def __init__(self, session: Any, sent: dict | None = None) -> None:
        super().__init__()
        self.session = session
        self.streams: dict[Any, int] = {}   # process group -> its NCCL stream's id
        self.collectives = 0
        self.sent = {} if sent is None else sent   # (group, n-th broadcast, tensor) -> the root's values
        self.broadcasts: dict[Any, int] = {}       # group -> broadcasts on it so far

    def nccl_stream(self, group: Any) -> int:
        """The NCCL stream of `group` (a group name, a ProcessGroup or the ScriptObject c10d ops
        receive): one per process group, as ProcessGroupNCCL keeps one per device."""
        name = group if isinstance(group, str) else _group_name(group)
        if name not in self.streams:
            from ..shims.devices import FakeStream
            self.streams[name] = FakeStream().stream_id
        return self.streams[name]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        namespace = func.namespace
        if func is _functional.wait_tensor.default:
            self.waited()   # the current stream waits for the collective
            return args[0]  # the tensor itself (Functional.cpp); the meta kernel makes a new one
        if func._schema.name == _WRAP_TENSOR_AUTOGRAD:
            # an AsyncCollectiveTensor around its input, as the op's CUDA implementation returns:
            # the first op that reads it calls wait_tensor (the current stream waits for NCCL)
            from torch.distributed._functional_collectives import AsyncCollectiveTensor
            return AsyncCollectiveTensor(args[0])
        if namespace not in ("c10d", "_c10d_functional"):
            return func(*args, **kwargs)
        self.collectives += 1
        if self.collectives == 1:
            _note_a_shared_device()
        # what other ranks wrote before this collective is there to find (at a barrier, once they reach it)
        run_files.synced(barrier=func is _c10d.barrier.default)
        flat = self._flat_buffer(func, args)
        out = _coalesced_work(args) if func in _COALESCED else func(*args, **kwargs)
        if flat is not None:
            self.session.storages.on_free(flat)
        if func is _c10d.broadcast_.default:
            self._broadcast_values(args)
        elif func is _c10d._allgather_base_.default:   # all_gather_into_tensor(output, input, group)
            self._gathered_values(args[0], args[1], _unboxed(args[2]).size())
        elif func is _functional.all_gather_into_tensor.default:   # (input, group_size, group_name)
            self._gathered_values(out, args[0], args[1])
        if self._is_async(func, args, kwargs):
            stream = self.nccl_stream(self._group(func, args))
            stream_uses.launched(stream)
            for t in _tensors(args) + _tensors(out):
                stream_uses.record(t, stream)
        return _with_valued_work(out)

    def _broadcast_values(self, args) -> None:
        """The root keeps the known values it sent; another rank gets what an earlier root sent, or
        unknown values (see above). args: (tensors, process_group, root_rank, ...)."""
        group = _unboxed(args[1])
        name = _group_name(group)
        n = self.broadcasts[name] = self.broadcasts.get(name, 0) + 1
        known = self.session.known
        for i, t in enumerate(_tensors(args[0])):
            if group.rank() == args[2]:
                value = known.value(t)
                if value is not None:
                    with torch._C.DisableTorchFunction():
                        self.sent[(name, n, i)] = value.clone()
            else:
                _receive(known, t, self.sent.get((name, n, i)), _global_rank(group, args[2]))

    def _gathered_values(self, output: torch.Tensor, input: torch.Tensor, world: int) -> None:
        """An all-gather into one tensor of known values: every rank's slot holds this rank's value
        (the ranks run one program: accelerate gathers each rank's tensor sizes to pad them all to
        the largest, and read zeros there). torch's fake group copies nothing into a flat output
        from a tensor of more than one dimension, so the value is written here."""
        known = self.session.known
        value = known.value(input)
        if value is None or not isinstance(output, torch.Tensor) or output.numel() != world * input.numel():
            return
        with torch._C.DisableTorchFunction():
            gathered = value.reshape(-1).repeat(world).reshape(output.shape)
        _receive(known, output, gathered, root=0)

    def waited(self) -> None:
        """The current stream waits for the NCCL streams: frees held for them complete."""
        for stream in self.streams.values():
            stream_uses.synchronised(stream)

    @staticmethod
    def _is_async(func, args, kwargs) -> bool:
        """Whether the op's tensors stay in NCCL's hands after the call: every functional
        collective, an op called with async_op=True, and point-to-point ops (send, recv_: they
        take no async_op and always return a Work, waited by dist.send/recv at once and by the
        script after isend/irecv/batch_isend_irecv)."""
        if func.namespace == "_c10d_functional":
            return True
        for i, a in enumerate(func._schema.arguments):
            if a.name == "async_op":
                return bool(kwargs.get("async_op", args[i] if i < len(args) else a.default_value))
        return func in _POINT_TO_POINT

    @staticmethod
    def _group(func, args) -> Any:
        for i, a in enumerate(func._schema.arguments):
            if a.name in ("process_group", "group_name") and i < len(args):
                return args[i]
        return "default"

    def _flat_buffer(self, func, args) -> int | None:
        """The flat buffer of the list forms (ProcessGroupNCCL::allgather / reduce_scatter)."""
        which = _LIST_FLATTENS.get(func)
        if which is None:
            return None
        nested = args[0] if which == "output" else args[1]
        tensors = _tensors(nested)
        if len(tensors) <= 1 or not any(self.session.storages.device_of(t) == "cuda" for t in tensors):
            return None
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        return self.session.storages.alloc_extra(nbytes, f"nccl_{func.__name__.split('.')[0]}_flat")


def _unboxed(group: Any) -> Any:
    """The ProcessGroup a c10d op was given (boxed as a ScriptObject)."""
    if isinstance(group, torch.ScriptObject):
        import torch.distributed as dist

        return dist.ProcessGroup.unbox(group)
    return group


def _group_name(group: Any) -> Any:
    group = _unboxed(group)
    return getattr(group, "group_name", None) or id(group)


def _global_rank(group: Any, group_rank: int) -> int:
    try:
        import torch.distributed as dist

        return dist.get_global_rank(group, group_rank)
    except (RuntimeError, ValueError, KeyError, AttributeError):
        return group_rank


def _receive(known: Any, t: torch.Tensor, value: torch.Tensor | None, root: int) -> None:
    """`t` (a fake tensor a broadcast wrote) holds `value` (what its root, global rank `root`,
    sent), or unknown values."""
    mine = known.value(t)
    whole = t.storage_offset() == 0 and t.is_contiguous() and t.numel() * t.element_size() == t.untyped_storage().nbytes()
    if value is None:
        known.await_root(t, root)   # a read of it asks for the root's recording first (ranks.py)
    elif value.shape != t.shape or value.dtype != t.dtype or (mine is None and not whole):
        known.forget(t)   # (the rest of a larger storage would be taken for known zeros)
    elif mine is not None:
        with torch._C.DisableTorchFunction():
            mine.copy_(value)
    else:
        known.remember(t, value)


def _coalesced_work(args) -> Any:
    """A coalesced collective's work, its future holding the tensors written (its first
    argument), as ProcessGroupNCCL's coalesced work does."""
    from torch._C._distributed_c10d import _create_work_from_future

    future: torch.futures.Future = torch.futures.Future()
    future.set_result(_tensors(args[0]))
    return _create_work_from_future(future).boxed()


def _with_valued_work(out: Any) -> Any:
    """A c10d op's (outputs, work) with a work whose future holds the outputs, as NCCL's does
    (ProcessGroupNCCL.cpp `collective()`: `future_->markCompleted(outputs)`); the fake group's
    future holds None, and a DDP comm hook reads the reduced bucket from it
    (`fut.value()[0]`, default_hooks.py)."""
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], torch.ScriptObject)):
        return out
    from torch._C._distributed_c10d import _create_work_from_future

    outputs = out[0] if isinstance(out[0], (list, tuple)) else [out[0]]
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(list(outputs))
    return out[0], _create_work_from_future(future).boxed()


class WorkWaits:
    """`work.wait()` of the fake process group's works: the current stream waits for the NCCL
    streams, so frees held for them complete (torch's Work / FakeWork, patched while a rank runs).
    C++ helpers that wait for their works inside C++ wait too when they return:
    `dist._broadcast_coalesced` (comm.cpp `broadcast_coalesced`: DDP's parameter and buffer
    broadcast flattens each bucket, broadcasts it and waits before unflattening)."""

    def __init__(self, mode: CollectiveMode) -> None:
        self.mode = mode

    def __enter__(self) -> "WorkWaits":
        import torch.distributed as dist
        from torch._C._distributed_c10d import FakeWork, Work
        from torch.distributed._functional_collectives import AsyncCollectiveTensor

        self.patches = PatchSet()
        for cls in (Work, FakeWork):
            if "wait" in cls.__dict__:
                self.patches.apply(WORK_WAIT, cls, "wait", _waiting(cls.__dict__["wait"], self.mode))
        for name in _WAITING_INSIDE:
            if hasattr(dist, name):
                self.patches.apply(WAITING_INSIDE, dist, name, _waiting(getattr(dist, name), self.mode))
        # An AsyncCollectiveTensor waits from inside its own __torch_dispatch__, where this mode is
        # popped and wait_tensor would reach its meta kernel (a copy): it waits here instead.
        act = AsyncCollectiveTensor
        self.patches.apply(ACT_WAIT, act, "trigger_wait", _act_waiting(self.mode, once=True))
        self.patches.apply(ACT_WAIT, act, "wait", _act_waiting(self.mode, once=False))
        return self

    def __exit__(self, *exc: Any) -> None:
        self.patches.close()


_WAITING_INSIDE = ("_broadcast_coalesced",)
WORK_WAIT = declare("torch._C._distributed_c10d.Work, FakeWork", "wait",
                    "work.wait(): the current stream waits for the NCCL streams (held frees complete)")
WAITING_INSIDE = declare("torch.distributed", "_broadcast_coalesced", "C++ that waits for its works inside waits too")
ACT_WAIT = declare("torch.distributed._functional_collectives.AsyncCollectiveTensor", "trigger_wait, wait",
                   "its first use waits for the NCCL streams here (inside its dispatch the mode is popped)")


def _act_waiting(mode: CollectiveMode, once: bool):
    """AsyncCollectiveTensor.trigger_wait (once) / wait: the current stream waits for the NCCL
    streams; the tensor is its element (wait_tensor returns its input)."""
    def wait(act):
        if not (once and act.completed):
            mode.waited()
            act.completed = True
        return act.elem
    return wait


def _waiting(original, mode: CollectiveMode):
    def wait(*args, **kwargs):
        result = original(*args, **kwargs)
        mode.waited()
        return result
    return wait
