"""The dispatch mode: every aten op inside a tracer passes here once, below autograd.

For each op: before it runs, the outputs of the previous op are handed to the graph capture (by
now autograd has given them their grad_fn, and the node has saved its tensors); a new backward is
noticed (the graph is complete at that moment: nothing is freed yet). After it runs, every output
whose storage is new becomes an AllocRecord (op, module, phase, time, block), and outputs made
outside backward are queued, weakly, for the capture.

An output is new unless the op's schema says it aliases an input (views, in-place and out=
ops) or the storage is already in the table. Per-op facts (name, aliasing, copy) are cached.
"""
from __future__ import annotations

import sys
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .accounting import _DEVICE_NAMES as _DEVICES
from .accounting import block_of, device_name, storage_of
from .records import AllocRecord

_COPY_OPS = {"_to_copy", "clone", "copy", "_copy_from", "_copy_from_and_resize", "lift_fresh_copy"}
_OPS: dict = {}
_DETACH = torch.ops.aten.detach.default


class OpInfo:
    __slots__ = ("name", "aliases", "is_copy")

    def __init__(self, func):
        self.name = str(func)  # "aten.addmm.default"
        try:
            self.aliases = tuple(r.alias_info is not None for r in func._schema.returns)
        except (AttributeError, RuntimeError):
            self.aliases = ()
        packet = getattr(func, "overloadpacket", None)
        self.is_copy = getattr(packet, "__name__", "") in _COPY_OPS


def op_info(func) -> OpInfo:
    info = _OPS.get(func)
    if info is None:
        info = _OPS[func] = OpInfo(func)
    return info


_DTYPES: dict = {}


def _dtype_name(dtype) -> str:
    name = _DTYPES.get(dtype)
    if name is None:
        name = _DTYPES[dtype] = str(dtype).replace("torch.", "")
    return name


def outputs_of(out):
    if isinstance(out, torch.Tensor):
        return (out,)
    if isinstance(out, (tuple, list)):
        return out
    return ()


def python_stack(limit: int = 16) -> list[str]:
    """The caller's Python frames, innermost last, without torch's and amem's own frames."""
    frames, f = [], sys._getframe(2)
    while f is not None and len(frames) < limit:
        name = f.f_code.co_filename
        if "/torch/" not in name and "amem_alloc/provenance" not in name:
            frames.append(f"{name}:{f.f_lineno} in {f.f_code.co_name}")
        f = f.f_back
    return frames[::-1]


class OpContext:
    """What is known about the program when an op starts."""

    __slots__ = ("phase", "module", "grad_node", "grad_node_module", "recompute", "ours")

    def __init__(self, phase, module):
        self.phase, self.module = phase, module
        self.grad_node = self.grad_node_module = None
        self.recompute = False
        self.ours = None  # True: the tracer's saved-tensor hooks are innermost; else whose are (a name)


class OpContextMode(TorchDispatchMode):
    """Hands every op to its tracer: before_op, then for each output new_record and the queue."""

    def __init__(self, tracer):
        super().__init__()
        self.tracer = tracer

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _DETACH:  # autograd saving an output: the node is not complete yet, wait
            return func(*args, **(kwargs or {}))
        tracer = self.tracer
        ctx = tracer.before_op()
        out = func(*args, **(kwargs or {}))
        info = _OPS.get(func) or op_info(func)
        aliases = info.aliases
        for i, o in enumerate(outputs_of(out)):
            if type(o) is torch.Tensor or isinstance(o, torch.Tensor):
                rec = None if (i < len(aliases) and aliases[i]) else new_record(tracer, info, ctx, o, args)
                if ctx.phase != "backward":
                    tracer.pending.append((weakref.ref(o), ctx.module, rec, ctx.ours))
        return out


def new_record(tracer, info: OpInfo, ctx: OpContext, tensor, args):
    """The AllocRecord for tensor's storage if it is new (and then added to the table), else None."""
    try:
        storage = tensor.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):  # sparse, nested: no plain storage
        return None
    ptr = storage.data_ptr()
    if not ptr:  # zero bytes, or meta: no block to account
        return None
    device = _DEVICES.get(tensor.device) or device_name(tensor.device)
    table = tracer.table
    if table.find((device, ptr), storage) is not None:
        return None
    rec = AllocRecord(info.name, ctx.module, ctx.phase, device, ptr, storage.nbytes(),
                      _DTYPES.get(tensor.dtype) or _dtype_name(tensor.dtype), tuple(tensor.shape))
    if info.is_copy or ctx.phase == "backward" or tracer.stacks:
        _annotate(tracer, rec, info, ctx, args)
    if tracer.exact_blocks and device.startswith("cuda"):
        rec._block = block_of(ptr, rec.nbytes, device)  # amem's block, while it is this storage's
    table.add(storage, rec)
    return rec


def _annotate(tracer, rec: AllocRecord, info: OpInfo, ctx: OpContext, args) -> None:
    if info.is_copy and args and isinstance(args[0], torch.Tensor):
        src = storage_of(args[0])
        if src is not None:
            key = src[1]
            rec.source = (key, _dtype_name(args[0].dtype), tracer.know.model_state.get(key),
                          tracer.is_input(key, src[0]))
        rec.autocast = tracer.scope.autocast_on
    if ctx.phase == "backward":
        rec.grad_node, rec.grad_node_module, rec.recompute = ctx.grad_node, ctx.grad_node_module, ctx.recompute
    if tracer.stacks:
        rec.stack = python_stack()
