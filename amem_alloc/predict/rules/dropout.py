"""Dropout as CUDA runs it: the fused kernel, which keeps a bool mask.

Design note
-----------
`at::dropout` (aten/src/ATen/native/Dropout.cpp) takes the fused `native_dropout` kernel when
`is_fused_kernel_acceptable`: a CUDA input, 0 < p < 1 and at least one element; its autograd node
keeps a bool mask. On any other device, meta included, it multiplies by a float noise tensor
(`_dropout_impl`), which keeps four times the bytes. `function` answers F.dropout that way for
fake CUDA tensors; `fused` is the same kernel for the composites written out here (attention's
math path).
"""
from __future__ import annotations

import torch

from .registry import Stage, rule

_NAMES = ("input", "p", "training", "inplace")


def fused(x, p: float):
    return torch.ops.aten.native_dropout(x, p, True)[0]


@rule(Stage.FUNCTION, "dropout", source="aten/src/ATen/native/Dropout.cpp (is_fused_kernel_acceptable)")
def function(func, args, kwargs, mode):
    """The CUDA output of F.dropout, or None where the fused kernel is not taken."""
    p = dict(zip(_NAMES, args))
    p.update(kwargs)
    if "train" in p:
        p["training"] = p.pop("train")
    x, prob, train = p["input"], p.get("p", 0.5), p.get("training", True)
    if not isinstance(x, torch.Tensor) or mode.storages.device_of(x) != "cuda":
        return None
    if p.get("inplace") or not train or not (0 < prob < 1) or x.numel() == 0:
        return None
    return fused(x, prob)
