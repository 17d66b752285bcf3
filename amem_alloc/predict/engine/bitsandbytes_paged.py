"""bitsandbytes' paged optimizer state, under prediction.

Design note
-----------
bitsandbytes' paged optimizers (`PagedAdamW8bit`, `PagedAdamW`, ...: torchtune's single-device
recipes default to `PagedAdamW8bit`) keep the state of each parameter of 100,000 elements or more
in CUDA managed memory: `bitsandbytes.functional.get_paged` asks its C library for
`cudaMallocManaged` bytes and wraps them as a tensor; `fill`, `_mul` and `prefetch_tensor` call
the library's kernels and `cudaMemPrefetchAsync` on them. Without a driver the library ends the
process ("CUDA driver version is insufficient", exit from C: no traceback, no prediction).

Managed memory is outside torch's caching allocator: its pages live on the GPU while the optimizer
steps and the driver moves them to host memory when the GPU runs short. No prediction can say
where the driver keeps them, so here each paged buffer is a CUDA tensor of its size made through
the caching allocator (zeros, as `fill(buff, 0)` makes it), its `is_paged` and `page_deviceid` set
as bitsandbytes sets them, and its prefetches do nothing: the figures count the state on the GPU,
where it is while the optimizer steps, which is the most the GPU holds of it. The output says so
at each call site that makes one, with the bytes ("not-modelled").
"""
from __future__ import annotations

from math import prod
from typing import Any

import torch

from ...patching import PatchSet, declare
from .. import notes

PAGED = declare("bitsandbytes.functional", "get_paged, prefetch_tensor, elementwise_func",
                "a paged (CUDA managed) buffer is a CUDA tensor made through the caching allocator; its "
                "prefetch does nothing; fill and mul on it are torch's (the library's C calls need a driver)")
IMPORT = declare("sys", "meta_path", "a copy, first of all finders one that patches bitsandbytes' paged buffers "
                 "as bitsandbytes.functional is imported (engine/bitsandbytes_paged.py)")
NOTE = ("bitsandbytes paged optimizer state: CUDA managed memory (cudaMallocManaged), outside the caching "
        "allocator, counted as allocated on the GPU, where it is while the optimizer steps (the driver moves it "
        "to host memory when the GPU runs short: the real peak can be lower by up to this)")


def _get_paged(*shape: int, dtype: torch.dtype = torch.float32, device: Any = None) -> torch.Tensor:
    device = torch.device("cuda", 0) if device is None else torch.device(device)
    out = torch.zeros(shape, dtype=dtype, device=device)
    out.is_paged = True
    out.page_deviceid = device.index
    notes.record(notes.NOT_MODELLED, NOTE, prod(shape) * dtype.itemsize)
    return out


def _prefetch_tensor(A: torch.Tensor, to_cpu: bool = False) -> None:
    assert A.is_paged, "Only paged tensors can be prefetched!"


def _elementwise(original: Any) -> Any:
    """elementwise_func(func_name, A, B, value, prefetch=True): fill and _mul of fake tensors as
    torch's own ops; anything else is the library's."""
    def elementwise_func(func_name: str, A: torch.Tensor, B: Any, value: Any, prefetch: bool = True) -> None:
        if A.device.type != "cuda":
            return original(func_name, A, B, value, prefetch)
        if func_name == "fill":
            A.fill_(value)
        elif func_name == "_mul":
            A.mul_(B)
        else:
            raise NotImplementedError(f"Function not implemented: {func_name}")
    return elementwise_func


def install(patches: PatchSet) -> None:
    """The patches above, once bitsandbytes.functional is imported."""
    patches.when_imported(IMPORT, "bitsandbytes.functional", lambda: _patch(patches))


def _patch(patches: PatchSet) -> None:
    import sys

    functional = sys.modules["bitsandbytes.functional"]
    if not all(hasattr(functional, name) for name in ("get_paged", "prefetch_tensor", "elementwise_func")):
        return   # a release this code does not know: its own calls run
    patches.apply(PAGED, functional, "get_paged", _get_paged)
    patches.apply(PAGED, functional, "prefetch_tensor", _prefetch_tensor)
    patches.apply(PAGED, functional, "elementwise_func", _elementwise(functional.elementwise_func))
