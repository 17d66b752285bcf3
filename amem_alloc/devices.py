"""What amem's CUDA allocators hold, per device: counters, segments, fragmentation, blocks.

These read (and reset) the per-device allocators that the C entry points serve torch from;
they need no torch import unless a device is named by torch.device or left to the current one.
amem_alloc.cuda re-exports them, and torch_patch builds torch's replacements on them.
"""
from __future__ import annotations

from typing import Any

from . import _C
from .introspection import Fragmentation, SegmentInfo, parse_fragmentation, parse_segments, parse_stats


def device_index(device: Any = None) -> int:
    if device is None:
        import torch

        return torch.cuda.current_device() if torch.cuda.is_initialized() else 0
    if isinstance(device, int):
        index = device
    else:
        import torch

        if isinstance(device, torch.cuda.device):  # a torch.cuda.device(...) context object
            device = device.idx
            if isinstance(device, int):
                return device_index(device)
        dev = torch.device(device)
        if dev.type != "cuda":
            raise ValueError(f"amem: {device!r} is not a CUDA device")
        # "cuda" without an index means the current device, as in torch.cuda.memory_allocated("cuda")
        index = dev.index if dev.index is not None else (
            torch.cuda.current_device() if torch.cuda.is_initialized() else 0)
    if index < 0:
        raise ValueError(f"amem: CUDA device index {index} is negative")
    return index


def memory_stats(device: Any = None) -> dict[str, int]:
    """amem's counters for a CUDA device, with torch.cuda.memory_stats() key names."""
    return parse_stats(_C.cuda_stats_json(device_index(device)))


def segments(device: Any = None) -> list[SegmentInfo]:
    """Every segment amem holds on a CUDA device, with its blocks."""
    return parse_segments(_C.cuda_segments_json(device_index(device)))


def fragmentation(device: Any = None) -> Fragmentation:
    return parse_fragmentation(_C.cuda_fragmentation_json(device_index(device)))


def empty_cache(device: Any = None) -> None:
    """Returns amem's cached whole segments on a device (all devices if None) to CUDA."""
    devices = _C.cuda_devices_in_use() if device is None else [device_index(device)]
    for d in devices:
        _C.cuda_empty_cache(d)


def block_info(address: int, device: Any = None) -> dict[str, int] | None:
    """The amem block holding a device address (e.g. tensor.data_ptr()), or None if amem has none."""
    start, size, requested, stream, seq = _C.cuda_block_info(device_index(device), int(address))
    if size == 0:
        return None
    return {"address": start, "size": size, "requested_size": requested, "stream": stream, "alloc_seq": seq}


def reset_peak_memory_stats(device: Any = None) -> None:
    _C.cuda_reset_peak_stats(device_index(device))


def reset_accumulated_memory_stats(device: Any = None) -> None:
    _C.cuda_reset_accumulated_stats(device_index(device))
