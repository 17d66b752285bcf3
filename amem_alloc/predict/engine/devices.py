"""Which device a fake tensor claims, as the code that runs now must see it: the per-thread
stacks that DeviceMode and the Recorder share (an explicit target device, a call's implicit
device, code that must see fake tensors as what they are, meta), and the helpers both read
arguments with."""
from __future__ import annotations

import threading
from typing import Any

import torch

from .. import state

META = torch.device("meta")
# ============================================================================ devices
_state = threading.local()


def explicit_device() -> str | None:
    stack = getattr(_state, "devices", None)
    return stack[-1] if stack else None


def implicit_device() -> str | None:
    """The device of the tensors of the torch function running now (None outside one)."""
    stack = getattr(_state, "implicit", None)
    return stack[-1] if stack else None


class Implicit:
    """Context manager: in this thread, the device of the torch function running now."""

    def __init__(self, device: str | None):
        self.device = device

    def __enter__(self):
        if not hasattr(_state, "implicit"):
            _state.implicit = []
        _state.implicit.append(self.device)

    def __exit__(self, *exc):
        _state.implicit.pop()


class unspoofed:
    """Context manager: in this thread, fake tensors answer their real device (meta) to device
    queries, as they do inside an op. Saved-tensor unpack hooks run so (session.py): they see the
    tensors as the pack hooks saw them in forward, from inside the op that saved them."""

    def __enter__(self):
        _state.unspoofed = getattr(_state, "unspoofed", 0) + 1

    def __exit__(self, *exc):
        _state.unspoofed -= 1


def spoofing() -> bool:
    return not getattr(_state, "unspoofed", 0)


class OnDevice:
    """Context manager: in this thread, an op's outputs go to `device` (a factory's or a copy's target)."""

    def __init__(self, device: str | None):
        self.device = device

    def __enter__(self):
        if not hasattr(_state, "devices"):
            _state.devices = []
        _state.devices.append(self.device)

    def __exit__(self, *exc):
        _state.devices.pop()


def cuda_index() -> int:
    """The device a fake CUDA tensor claims: the current one (torch.cuda.set_device under prediction;
    a process of a distributed job uses the one device its LOCAL_RANK picked)."""
    st = state.current()
    return st.thread.device_index if st is not None else 0


def device_type(device: Any) -> str | None:
    """"cuda" / "cpu" / ... for a device argument (str, int, torch.device), None for none."""
    if device is None:
        return None
    if isinstance(device, int):
        return "cuda"
    return torch.device(device).type


def wrapper_subclass(kind: type) -> bool:
    """A tensor subclass that wraps plain tensors (DTensor: __tensor_flatten__), not FakeTensor."""
    return kind is not torch.Tensor and hasattr(kind, "__tensor_flatten__")


def leaves(args, kwargs) -> list:
    """The arguments of an aten op, with lists and tuples of them (aten's only nesting) opened."""
    out = []
    for a in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(a, (list, tuple)):
            out.extend(a)
        else:
            out.append(a)
    return out

