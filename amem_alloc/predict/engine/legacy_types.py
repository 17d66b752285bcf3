"""torch's legacy typed-tensor API under prediction: `torch.cuda.FloatTensor` and its nine
siblings, `Tensor.type(...)` with a CUDA type, `torch.set_default_tensor_type`.

Design note
-----------
`torch.cuda.FloatTensor` is a tensor type object that torch's C++ puts on `torch.cuda`
(torch/csrc/tensor/python_tensor.cpp): calling it runs the legacy constructor, which initialises
CUDA first (there is no driver here); `isinstance(t, torch.cuda.FloatTensor)` checks the tensor's
dispatch key and dtype, which a fake tensor (meta) does not have; `Tensor.type(t)` goes to C++
that initialises CUDA for a CUDA type. Old code and libraries use them still: torchsummary's
`summary` makes its inputs with `torch.rand(2, *size).type(torch.cuda.FloatTensor)`.

Under prediction each of the ten `torch.cuda` types is a stand-in class (`stand_in`): calling it
makes a fake CUDA tensor as the legacy constructor would (no argument: an empty tensor; sizes: an
uninitialised tensor of that size; a sequence or array: a tensor of that data; a tensor: that
tensor in the type), `isinstance` answers for fake CUDA tensors of its dtype, and it carries
`dtype` and `is_cuda` as the type objects do. `target(x)` reads any way of naming a type (a stand-in,
torch's type objects, "torch.cuda.HalfTensor", "torch.FloatTensor") as (device type, dtype);
DeviceMode answers `Tensor.type` with it (a `.to()` where the type differs, the same tensor where
it does not, and the type's name, "torch.cuda.FloatTensor", for a fake CUDA tensor), and
`set_default_tensor_type` (torch_patches.py) makes factories without a device allocate on CUDA.
"""
from __future__ import annotations

from typing import Any

import torch

DTYPES = {"FloatTensor": torch.float32, "DoubleTensor": torch.float64, "HalfTensor": torch.float16,
          "BFloat16Tensor": torch.bfloat16, "ByteTensor": torch.uint8, "CharTensor": torch.int8,
          "ShortTensor": torch.int16, "IntTensor": torch.int32, "LongTensor": torch.int64, "BoolTensor": torch.bool}
NAMES = tuple(DTYPES)
_NAME_OF = {dtype: name for name, dtype in DTYPES.items()}


class LegacyCudaType(type):
    """The metaclass of the stand-ins: how `torch.cuda.FloatTensor(...)` and `isinstance` answer."""

    dtype: torch.dtype

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, torch.Tensor) and obj.dtype == cls.dtype and obj.is_cuda

    def __call__(cls, *args: Any, **kwargs: Any) -> torch.Tensor:
        kwargs.pop("device", None)   # the legacy constructor takes one; the type says CUDA
        if not args:
            return torch.empty(0, dtype=cls.dtype, device="cuda")
        if len(args) == 1 and isinstance(args[0], torch.Size) or all(type(a) is int for a in args):
            sizes = tuple(args[0]) if isinstance(args[0], torch.Size) else args
            return torch.empty(sizes, dtype=cls.dtype, device="cuda")
        if len(args) == 1 and isinstance(args[0], torch.Tensor):
            return args[0].to(device="cuda", dtype=cls.dtype)
        return torch.tensor(args[0], dtype=cls.dtype, device="cuda")

    def __repr__(cls) -> str:
        return f"<class 'torch.cuda.{cls.__name__}'>"


def stand_in(name: str) -> type:
    """The stand-in for torch.cuda.<name>."""
    return LegacyCudaType(name, (), {"dtype": DTYPES[name], "is_cuda": True, "is_sparse": False,
                                     "__module__": "torch.cuda", "__qualname__": name})


def target(x: Any) -> tuple[str, torch.dtype] | None:
    """(device type, dtype) of a legacy type however it is named; None for anything else (a dtype)."""
    if isinstance(x, str):
        module, _, name = x.rpartition(".")
        if name in DTYPES and module in ("torch", "torch.cuda"):
            return ("cuda" if module == "torch.cuda" else "cpu"), DTYPES[name]
        return None
    if isinstance(x, LegacyCudaType):
        return "cuda", x.dtype
    if isinstance(x, type) and isinstance(getattr(x, "dtype", None), torch.dtype) and \
            getattr(x, "__name__", "") in DTYPES and getattr(x, "__module__", "") in ("torch", "torch.cuda"):
        return ("cuda" if x.__module__ == "torch.cuda" else "cpu"), x.dtype
    return None


def name_of(device: str, dtype: torch.dtype) -> str | None:
    """The legacy type's name of a tensor on `device` of `dtype` ("torch.cuda.HalfTensor"), or None."""
    name = _NAME_OF.get(dtype)
    if name is None:
        return None
    return f"torch.cuda.{name}" if device == "cuda" else f"torch.{name}"
