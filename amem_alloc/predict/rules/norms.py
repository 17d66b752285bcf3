"""Norms as CUDA runs them: cuDNN's batch norm where torch picks it, and RMS norm's fused kernel, each
with what its kernel returns and its autograd node saves.

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

RMS norm: `torch.rms_norm` (aten/src/ATen/native/layer_norm.cpp `rms_norm_symint`) calls
`_fused_rms_norm` unless the input is channels-last or complex or the weight's dtype differs from
the input's (then its composite). On CUDA that op is one kernel (cuda/layer_norm_kernel.cu):
the output like the input and the inverse RMS [*outer, 1...] in float32 (float64 for double), and
its node (FusedRmsNormBackward) saves the input, the inverse RMS and the weight; backward
(`_fused_rms_norm_backward`) makes the input's and the weight's gradients, on contiguous copies of
the gradient and input where they are not contiguous (`expect_contiguous`). A meta tensor has no
such kernel: `_fused_rms_norm` decomposes into pow, mean, rsqrt and two muls, each recorded by
autograd, so the normalised input would be saved once more per norm. `rms_norm` makes the CUDA
op's outputs and node itself (_FusedRmsNorm).
"""
from __future__ import annotations

import torch
import torch._prims_common as prims

from .registry import Stage, aten_op, rule
from .scratch import Scratch, nbytes

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


# ============================================================================ RMS norm
_RMS_NAMES = ("input", "normalized_shape", "weight", "eps")


@rule(Stage.FUNCTION, "rms_norm", source="aten/src/ATen/native/layer_norm.cpp (rms_norm_symint); cuda/layer_norm_kernel.cu")
def rms_norm(func, args, kwargs, mode):
    """The CUDA output of F.rms_norm / torch.rms_norm where the fused kernel runs; None otherwise."""
    p = dict(zip(_RMS_NAMES, args))
    p.update(kwargs)
    x, w = p.get("input"), p.get("weight")
    if not isinstance(x, torch.Tensor) or mode.storages.device_of(x) != "cuda" or not _fused_rms_available():
        return None
    shape = p.get("normalized_shape")
    shape = [shape] if isinstance(shape, int) else list(shape)
    if x.is_complex() or prims.suggest_memory_format(x) != torch.contiguous_format or x.dim() < len(shape):
        return None   # rms_norm_symint's composite (and its own shape checks)
    if w is not None and w.dtype != x.dtype:
        return None
    return _FusedRmsNorm.apply(x, shape, w, p.get("eps"))


def _fused_rms_available() -> bool:
    return hasattr(torch.ops.aten, "_fused_rms_norm") and torch._C._dispatch_has_kernel_for_dispatch_key(
        "aten::_fused_rms_norm", "CUDA")


class _FusedRmsNorm(torch.autograd.Function):
    """`_fused_rms_norm` and its node: the output and the inverse RMS, saving input, inverse RMS and
    weight; backward is torch's `_fused_rms_norm_backward` (its Meta kernel gives CUDA's outputs)."""

    @staticmethod
    def forward(ctx, x, shape, w, eps):
        outer = x.shape[:x.dim() - len(shape)]
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        rstd = x.new_empty((*outer, *(1,) * len(shape)), dtype=torch.float64 if x.dtype == torch.float64 else torch.float32)
        ctx.shape = shape
        ctx.save_for_backward(x, rstd, w)
        return out

    @staticmethod
    def backward(ctx, grad):
        x, rstd, w = ctx.saved_tensors
        mask = [ctx.needs_input_grad[0], w is not None and ctx.needs_input_grad[2]]
        dx, dw = torch.ops.aten._fused_rms_norm_backward(grad, x, ctx.shape, rstd, w, mask)
        return dx, None, dw, None


@rule(Stage.KERNEL, aten_op("_fused_rms_norm_backward"), source="aten/src/ATen/native/cuda/layer_norm_kernel.cu (expect_contiguous)")
def rms_norm_backward(args, kwargs, s: Scratch, session) -> None:
    for t, what in ((args[0], "grad_out contiguous"), (args[1], "input contiguous")):
        if not t.is_contiguous():
            s.take(nbytes(t.shape, t.dtype), what)
