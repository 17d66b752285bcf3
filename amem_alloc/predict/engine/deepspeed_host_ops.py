"""DeepSpeed's ops under prediction: ZeRO-Offload's CPU optimizers on host copies of fake tensors,
and its CUDA ops never built.

Design note
-----------
With `offload_optimizer: {device: cpu}` DeepSpeed keeps the fp32 master partition and the optimizer
state in host memory and steps them with a C++ op (`DeepSpeedCPUAdam`: `ds_opt_adam.adam_update`
on each tensor's memory; CPUAdagrad and CPULion alike). Under prediction that partition is a host
copy of a fake tensor, a meta tensor that answers "cpu", with no memory behind it: the op read it
and the process ended in a segmentation fault, with no word of why. Host memory is no GPU memory,
and the values are unknown to a prediction anyway, so a call of a DeepSpeed op given such a tensor
is skipped (it returns None: the updates are in place); the state the optimizer allocates is made
as DeepSpeed makes it, and calls on real host tensors run. The ops come from `OpBuilder.load`,
wrapped as DeepSpeed is imported (each rank imports its own: fresh_libraries.py).

A CUDA op (a `CUDAOpBuilder`'s: FusedAdam, which DeepSpeed's config makes for `"optimizer":
{"type": "AdamW"}`, FusedLamb, the inference kernels) is compiled by nvcc as it is first loaded,
for the GPU of the machine: with no GPU toolkit the build failed ("cusparse.h: No such file"),
read as the script's failure, and where it builds its kernels would run on fake tensors. Under
prediction it is never built. The fused optimizers' ops update their tensors in place and
allocate nothing on the device (csrc/adam/multi_tensor_adam.cu, multi_tensor_apply.cuh: the
tensors' own memory, chunk by chunk), so their stand-in does nothing, noted; the state they step
is made by the optimizer's Python as on a GPU. Any other CUDA op says, where it is called, that it
is not modelled.
"""
from __future__ import annotations

import functools
import sys
from typing import Any

import torch

from ...patching import PatchSet, declare
from .. import notes

LOAD = declare("deepspeed.ops.op_builder.builder.OpBuilder", "load",
               "an op's calls given host copies of fake tensors (no memory behind them) are skipped: "
               "DeepSpeedCPUAdam's update read them and crashed the process; a CUDA op is never built "
               "(engine/deepspeed_host_ops.py)")
IMPORT = declare("sys", "meta_path", "a copy, first of all finders one that wraps DeepSpeed's ops as "
                 "deepspeed.ops.op_builder.builder is imported (engine/deepspeed_host_ops.py)")
IN_PLACE = ("fused_adam", "fused_lamb", "fused_lion")   # CUDA ops that update their tensors in place
UNBUILT_NOTE = ("DeepSpeed's CUDA op {name}: not built (it compiles for a GPU); its updates are in place and "
                "allocate nothing on the device, as its kernels do")


def _has_fake(values) -> bool:
    with torch._C.DisableTorchFunction():   # the device a fake tensor really has (meta), not the one it answers
        return any(isinstance(v, torch.Tensor) and v.is_meta for v in values)


class SkipsFakeTensors:
    """An op module whose functions, given a fake tensor, do nothing."""

    def __init__(self, ops: Any) -> None:
        self._ops = ops

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._ops, name)
        if not callable(fn):
            return fn

        @functools.wraps(fn)
        def call(*args, **kwargs):
            if _has_fake((*args, *kwargs.values())):
                return None
            return fn(*args, **kwargs)
        setattr(self, name, call)   # made once: the optimizer calls it per parameter, per step
        return call


def install(patches: PatchSet) -> None:
    """The patch above, once DeepSpeed's op builders are imported."""
    patches.when_imported(IMPORT, "deepspeed.ops.op_builder.builder", lambda: _patch(patches))


class UnbuiltCudaOps:
    """A CUDA op module never built: an in-place optimizer op does nothing; any other op, called,
    is not modelled."""

    def __init__(self, name: str) -> None:
        self._name = name
        if name in IN_PLACE:
            notes.record(notes.STAND_IN, UNBUILT_NOTE.format(name=name))

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        name = self._name

        def call(*args, **kwargs):
            if name in IN_PLACE:
                return None
            raise notes.NotModelledError(f"DeepSpeed's CUDA op {name}.{attribute} (it is compiled for a GPU and "
                                         "never built under prediction)")
        return call


def _patch(patches: PatchSet) -> None:
    module = sys.modules["deepspeed.ops.op_builder.builder"]
    builder, cuda = module.OpBuilder, getattr(module, "CUDAOpBuilder", ())
    load = builder.load

    def load_skipping_fakes(self, *args, **kwargs):
        if cuda and isinstance(self, cuda):
            return UnbuiltCudaOps(getattr(self, "name", type(self).__name__))
        ops = load(self, *args, **kwargs)
        return ops if isinstance(ops, SkipsFakeTensors) else SkipsFakeTensors(ops)
    patches.apply(LOAD, builder, "load", load_skipping_fakes)
