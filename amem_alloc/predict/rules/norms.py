"""Batch norm as CUDA runs it: cuDNN's kernel where torch picks it, with what cuDNN returns and saves.

Design note
-----------
`torch.batch_norm` is composite: `_batch_norm_impl_index` (aten/src/ATen/native/Normalization.cpp)
asks `_select_batch_norm_backend` and, for cuDNN, calls `cudnn_batch_norm` on
`input.contiguous(input.suggest_memory_format())` and contiguous weight, bias and running stats.
cuDNN is taken when the input is CUDA and neither it nor the weight is bfloat16, a float16 input
comes with a float32 weight, weight and bias are given, running stats are both given or both
absent in training, the input has 3 or more dims, the batch is at most 880801 in training (65535
in eval), torch has cuDNN and it is enabled, eps is at least cuDNN's minimum (0 in cuDNN 8 and 9),
and the input has fewer than 2**31 - 1 elements. Otherwise it is `native_batch_norm`, which is what
a meta tensor always takes.

The two save different things: `cudnn_batch_norm` returns (output, save_mean, save_var, reserve)
and its autograd node (CudnnBatchNormBackward) keeps input, weight, running stats, save_mean,
save_var and the reserve, and backward calls `cudnn_batch_norm_backward` on
`grad.contiguous(input.suggest_memory_format())`; in eval its save_mean and save_var are empty.
`function` calls `cudnn_batch_norm` itself where CUDA would, so the node and its saved tensors are
cuDNN's. cuDNN's reserve space and workspaces (`cudnnGetBatchNormalizationTrainingExReserveSpaceSize`,
`...ForwardTrainingExWorkspaceSize`) are taken as 0: for a plain batch norm (no fused activation)
cuDNN needs none that we know of, and their sizes cannot be read without cuDNN.
"""
from __future__ import annotations

import torch
import torch._prims_common as prims

from .registry import Stage, rule

_F_NAMES = ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps")
_TORCH_NAMES = ("input", "weight", "bias", "running_mean", "running_var", "training", "momentum", "eps",
                "cudnn_enabled")


@rule(Stage.FUNCTION, "batch_norm", source="aten/src/ATen/native/Normalization.cpp (_batch_norm_impl_index)")
def batch_norm(func, args, kwargs, mode):
    """The CUDA output of F.batch_norm / torch.batch_norm where cuDNN runs it; None otherwise."""
    if func is not torch.nn.functional.batch_norm and func is not torch.batch_norm:
        return None
    functional = func is torch.nn.functional.batch_norm
    p = dict(zip(_F_NAMES if functional else _TORCH_NAMES, args))
    p.update(kwargs)
    x = p.get("input")
    if not isinstance(x, torch.Tensor) or mode.storages.device_of(x) != "cuda" or x.numel() == 0:
        return None
    training = bool(p.get("training", False))
    if functional and training:
        torch.nn.functional._verify_batch_size(x.size())
    w, b, rm, rv = (p.get(n) for n in ("weight", "bias", "running_mean", "running_var"))
    eps = float(p.get("eps", 1e-5))
    if not uses_cudnn(x, w, b, rm, rv, training, eps):
        return None
    contiguous = lambda t: t.contiguous() if t is not None else None
    x = x.contiguous(memory_format=prims.suggest_memory_format(x))
    return torch.ops.aten.cudnn_batch_norm(x, contiguous(w), contiguous(b), contiguous(rm), contiguous(rv),
                                           training, float(p.get("momentum", 0.1)), eps)[0]


def uses_cudnn(x, w, b, rm, rv, training: bool, eps: float) -> bool:
    """_select_batch_norm_backend == Cudnn, for a fake CUDA input."""
    if w is None or b is None:
        return False
    if torch.bfloat16 in (x.dtype, w.dtype) or (x.dtype == torch.float16 and w.dtype != torch.float32):
        return False
    stats = (rm is not None and rv is not None) or (rm is None and rv is None and training)
    batch_ok = x.shape[0] <= 880801 if training else x.shape[0] <= 65535
    return (stats and x.dim() >= 3 and batch_ok and torch.backends.cudnn.is_available()
            and torch.backends.cudnn.enabled and eps >= 0.0 and x.numel() < 2**31 - 1)
