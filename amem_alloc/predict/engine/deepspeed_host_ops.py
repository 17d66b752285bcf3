"""DeepSpeed's host ops under prediction: ZeRO-Offload's CPU optimizers on host copies of fake tensors.

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
"""
from __future__ import annotations

import functools
import sys
from typing import Any

import torch

from ...patching import PatchSet, declare

LOAD = declare("deepspeed.ops.op_builder.builder.OpBuilder", "load",
               "an op's calls given host copies of fake tensors (no memory behind them) are skipped: "
               "DeepSpeedCPUAdam's update read them and crashed the process (engine/deepspeed_host_ops.py)")
IMPORT = declare("sys", "meta_path", "a copy, first of all finders one that wraps DeepSpeed's ops as "
                 "deepspeed.ops.op_builder.builder is imported (engine/deepspeed_host_ops.py)")


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


def _patch(patches: PatchSet) -> None:
    builder = sys.modules["deepspeed.ops.op_builder.builder"].OpBuilder
    load = builder.load

    def load_skipping_fakes(self, *args, **kwargs):
        ops = load(self, *args, **kwargs)
        return ops if isinstance(ops, SkipsFakeTensors) else SkipsFakeTensors(ops)
    patches.apply(LOAD, builder, "load", load_skipping_fakes)
