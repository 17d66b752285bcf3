"""Triton kernels the program launches itself (`@triton.jit`, `kernel[grid](...)`), under prediction.

Design note
-----------
Training code calls Triton kernels of its own or a library's (modded-nanogpt's, Liger-Kernel's,
flash-linear-attention's). Launching one needs a driver: with no GPU, Triton stops in its CUDA
backend ("libcuda.so cannot found"), and the program would stop where on the GPU it runs on.

A Triton kernel allocates nothing from torch's caching allocator: it writes into the tensors its
caller made with torch (which the prediction records as it records every allocation). So while a
prediction runs, a launch runs nothing and returns None, and an autotuned kernel (`@triton.autotune`,
which benchmarks its configs on the GPU) launches without benchmarks; the memory is as on the
GPU. The tensors a kernel is given may be written with values nobody computed: any the prediction
knew the value of (known.py) is forgotten, so a later read gets a stand-in, not a stale value.
Each kernel is noted once per call site. Not modelled: the scratch memory a kernel asks of the
allocator given to `triton.set_allocator` (TMA descriptors, global scratch), which runs only with
the kernel.
"""
from __future__ import annotations

import importlib.util

import torch

from ...patching import PatchSet, declare
from .. import notes

LAUNCH = declare("triton.runtime.jit.JITFunction", "run",
                 "while a prediction runs: a Triton kernel the program launches runs nothing (no GPU; it allocates "
                 "nothing of torch's), and the tensors it is given lose their known values")
AUTOTUNE = declare("triton.runtime.autotuner.Autotuner", "run",
                   "while a prediction runs: an autotuned Triton kernel launches without benchmarking its configs "
                   "(benchmarks need the GPU)")
NOTE = ("Triton kernel {name}: launched as a stand-in that runs nothing (no GPU here); a Triton kernel allocates "
        "nothing of torch's caching allocator (it writes the caller's tensors, which hold no values), so memory "
        "is as on the GPU; scratch it would ask of triton.set_allocator's allocator is not modelled")


def install(session, patches: PatchSet) -> None:
    """Triton's launches stood in for, until `patches` close (nothing where Triton is not installed)."""
    if importlib.util.find_spec("triton") is None:
        return
    try:
        from triton.runtime.autotuner import Autotuner
        from triton.runtime.jit import JITFunction
    except Exception:   # a Triton this code does not know: launches stop where Triton stops them
        return
    patches.apply(LAUNCH, JITFunction, "run", _launch_for(session))
    patches.apply(AUTOTUNE, Autotuner, "run", lambda self, *args, **kwargs: self.fn.run(*args, **kwargs))


def _launch_for(session):
    @torch._dynamo.disable   # inside a compiled region dynamo must not trace amem's stand-in: it runs as is
    def launch(kernel, *args, **kwargs):
        for value in (*args, *kwargs.values()):
            if isinstance(value, torch.Tensor):
                session.known.forget(value)
        notes.record(notes.STAND_IN, NOTE.format(name=_name(kernel)))
        return None
    return launch


def _name(kernel) -> str:
    fn = getattr(kernel, "fn", None)
    return getattr(kernel, "__name__", None) or getattr(fn, "__name__", None) or "kernel"
