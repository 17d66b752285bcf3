"""Byte accounting: what the allocator really spent for a storage, chosen by the storage's device.

    cpu                     nominal bytes, and the block the 512-byte rounding would make on a GPU
    cuda, amem enabled      amem's real block (block_info): size, requested bytes, stream, alloc_seq
    cuda, native allocator  the rounding (torch's policy, the same function amem's core uses)

One lookup per device type (_LOOKUPS); everything above this file is the same code for every
device. Rounding uses amem's round_size with the roundup_power2_divisions setting from
PYTORCH_CUDA_ALLOC_CONF when one is set (the only key that changes rounding), else the default.
"""
from __future__ import annotations

import functools
import os

from .. import _C


class Block:
    """The allocator's view of one storage."""

    __slots__ = ("address", "size", "requested", "stream", "alloc_seq", "allocator", "exact")

    def __init__(self, address, size, requested, allocator, exact, stream=None, alloc_seq=None):
        self.address = address      # block start (the storage's data_ptr unless amem says otherwise)
        self.size = size            # bytes the allocator spent (real block, or the rounding)
        self.requested = requested  # bytes asked for
        self.allocator = allocator  # "amem", "native", "cpu", "amem-unknown"
        self.exact = exact          # size is a real block size, not a rounding
        self.stream = stream        # amem only
        self.alloc_seq = alloc_seq  # amem only

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


# ---------------------------------------------------------------- rounding ---------------------

def _rounding_conf() -> str:
    """roundup_power2_divisions from PYTORCH_CUDA_ALLOC_CONF, in amem's syntax, or ""."""
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    parts = [p.strip() for p in conf.split(",") if p.strip().startswith("roundup_power2_divisions")]
    if not parts:
        return ""
    try:
        _C.round_size(512, parts[0])  # validated by amem's core
        return parts[0]
    except Exception:  # a value amem does not accept: fall back to the plain 512-byte rounding
        return ""


@functools.lru_cache(maxsize=8192)
def rounded(nbytes: int, conf: str = "") -> int:
    """Bytes torch's CUDA caching allocator spends for a request of nbytes (0 stays 0)."""
    return 0 if nbytes <= 0 else int(_C.round_size(int(nbytes), conf))


def _rounded_block(ptr: int, nbytes: int, device: str) -> Block:
    kind = "native" if device.startswith("cuda") else "cpu"
    return Block(ptr, rounded(nbytes, _CONF), nbytes, kind, exact=False)


# ---------------------------------------------------------------- device lookups ---------------

def _device_index(device: str) -> int:
    return int(device.partition(":")[2] or 0)


def _cuda_block(ptr: int, nbytes: int, device: str) -> Block:
    from ..cuda import block_info, is_enabled

    if not is_enabled():
        return _rounded_block(ptr, nbytes, device)
    info = block_info(ptr, _device_index(device)) if nbytes else None
    if info is None:  # not an amem block: allocated before enable(), or not by a caching allocator
        block = _rounded_block(ptr, nbytes, device)
        block.allocator = "amem-unknown"
        return block
    return Block(info["address"], info["size"], info["requested_size"], "amem", exact=True,
                 stream=info["stream"], alloc_seq=info["alloc_seq"])


_LOOKUPS = {"cuda": _cuda_block}
_CONF = _rounding_conf()


def block_of(ptr: int, nbytes: int, device: str) -> Block:
    """The allocator's block for a storage at ptr of nbytes on device ("cpu", "cuda:0")."""
    return _LOOKUPS.get(device.partition(":")[0], _rounded_block)(ptr, nbytes, device)


def exact_blocks_on(device: str) -> bool:
    """Whether blocks on this device are real (amem's) and so must be read while they live."""
    from ..cuda import is_enabled

    return device.startswith("cuda") and is_enabled()


_DEVICE_NAMES: dict = {}


def device_name(device) -> str:
    name = _DEVICE_NAMES.get(device)
    if name is None:
        name = _DEVICE_NAMES[device] = str(device)
    return name


def storage_of(tensor):
    """(storage, key, nbytes) of a dense tensor, or None for tensors without a plain storage.
    key is (device name, data_ptr)."""
    try:
        storage = tensor.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):  # sparse, nested, functional wrappers
        return None
    device = device_name(tensor.device)
    if device == "meta":
        return None
    return storage, (device, storage.data_ptr()), storage.nbytes()


def segment_of(ptr: int, device: str) -> dict | None:
    """The amem segment holding ptr (address, total size, stream, type), or None."""
    from ..cuda import is_enabled, segments

    if not device.startswith("cuda") or not is_enabled():
        return None
    for seg in segments(_device_index(device)):
        if seg.address <= ptr < seg.address + seg.total_size:
            return {"address": seg.address, "size": seg.total_size, "stream": seg.stream,
                    "segment_type": seg.segment_type, "is_expandable": seg.is_expandable}
    return None
