"""`torch.nn.DataParallel` under prediction: its scatter and gather, on the one device predicted.

Design note
-----------
DataParallel (PyTorch's ImageNet example wraps every model in it) splits each batch across the
process's GPUs with `torch._C._scatter` and joins the outputs with `torch._C._gather`: C++ that no
mode sees, which asks CUDA's driver for the device of a fake tensor and stops with "Found no
NVIDIA driver". A prediction models one device, which is what DataParallel sees when the card
predicted is one (`torch.cuda.device_count()` answers 1): the batch is "scattered" to that device
and the module runs on it unreplicated. Here both are what comm.cpp does, as torch ops the modes
record: scatter splits the tensor into chunks (`split_with_sizes` or `chunk`), views that cost
nothing, copying only a chunk that lives elsewhere (a CPU batch) to its device; gather allocates
the joined result once on the destination and copies each part into it. Scattering across more
than one device in one process is not modelled: it stops with one line that says so.
"""
from __future__ import annotations

import torch

from ...patching import PatchSet, declare
from ..notes import NotModelledError

SCATTER = declare("torch._C", "_scatter", "DataParallel's scatter as comm.cpp does it, in ops the modes record "
                  "(on the one device predicted; C++ would ask the driver for the fake tensors' device)")
GATHER = declare("torch._C", "_gather", "DataParallel's gather as comm.cpp does it, in ops the modes record")
SEVERAL = ("torch.nn.DataParallel over {n} devices in one process: a prediction models one device (predict "
           "with one card, or use DistributedDataParallel, one process per device)")


def install(patches: PatchSet) -> None:
    patches.apply(SCATTER, torch._C, "_scatter", scatter)
    patches.apply(GATHER, torch._C, "_gather", gather)


def scatter(tensor: torch.Tensor, devices, chunk_sizes=None, dim: int = 0, streams=None) -> tuple:
    """comm.cpp's scatter: the chunks of `tensor`, each on its device (a view where it is there already)."""
    devices = [int(d) for d in devices]
    if len(set(devices)) > 1:
        raise NotModelledError(SEVERAL.format(n=len(set(devices))))
    chunks = tensor.split(list(chunk_sizes), dim) if chunk_sizes else tensor.chunk(len(devices), dim)
    return tuple(chunk if _on(chunk, device) else chunk.to(torch.device("cuda", device), non_blocking=True)
                 for chunk, device in zip(chunks, devices))


def gather(tensors, dim: int = 0, destination=None) -> torch.Tensor:
    """comm.cpp's gather: one result on `destination` (its index; -1 the CPU; None the current
    device), each part copied into it."""
    tensors = list(tensors)
    devices = {(t.device.type, t.device.index) for t in tensors}
    if len(devices) > 1:
        raise NotModelledError(SEVERAL.format(n=len(devices)))
    first = tensors[0]
    shape = list(first.shape)
    shape[dim] = sum(t.shape[dim] for t in tensors)
    device = torch.device("cpu") if destination == -1 else torch.device("cuda", destination if destination is not None
                                                                          else torch.cuda.current_device())
    out = torch.empty(shape, dtype=first.dtype, device=device)
    start = 0
    for t in tensors:
        out.narrow(dim, start, t.shape[dim]).copy_(t, non_blocking=True)
        start += t.shape[dim]
    return out


def _on(t: torch.Tensor, device: int) -> bool:
    return t.device.type == "cuda" and (t.device.index or 0) == device
