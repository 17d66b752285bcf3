"""Meta kernels for ops whose CUDA kernel torch ships without a Meta one: fused optimizers, AMP's
scaler ops, CTC loss's backward.

Design note
-----------
A fake CUDA tensor is a meta tensor, so every op it meets needs a Meta kernel. Some ops exist
only for CUDA (aten/src/ATen/native/cuda/fused_adam*.cu, FusedSgdKernel.cu, fused_adagrad*.cu,
AmpKernels.cu) and torch registers no Meta kernel for some of their overloads: the in-place fused
optimizers' `tensor_lr` overloads (lr given as a tensor), every `_fused_sgd_` and
`_fused_adagrad_`, and in some releases the GradScaler ops. All of them update their tensor-list
arguments in place and return nothing (`_amp_update_scale_` returns its first argument), and the
CUDA kernels take no memory of their own: `multi_tensor_apply` passes the tensor lists' addresses
as kernel arguments (MultiTensorApply.cuh), so they allocate nothing on the device. Their Meta
kernels therefore only return, and are registered (torch.library, dispatch key Meta) only where
`torch._C._dispatch_has_kernel_for_dispatch_key` says torch has none, by each prediction session
while it runs (MetaKernels): outside one, torch is as it was.

`_ctc_loss_backward` (both overloads) returns the gradient of its log-probabilities, a tensor of
their shape and dtype, contiguous (LossCTC.cu: `at::full_like(log_probs, neginf,
LEGACY_CONTIGUOUS_MEMORY_FORMAT)`); its kernel's own temporaries are a KERNEL rule
(rules/losses.py).

`_scaled_mm.out` (the FP8 matmul inductor's generated code calls with its own output buffer:
torchao's float8 training under torch.compile) has no Meta kernel where `_scaled_mm` has one: it
writes the default overload's result shape into `out` (resized, as an out= kernel does), which
is how torch's CUDA out= kernel treats it (Blas.cpp `_scaled_mm_out_cuda`).

SyncBatchNorm's CUDA ops (Normalization.cu) have no Meta kernels: `batch_norm_stats` returns the
per-channel mean and inverse std, `[C]` in the accumulate type (float for half and bfloat16 input);
`batch_norm_gather_stats(_with_counts)` the same from the gathered `[world, C]` statistics, in their
accumulate type; `batch_norm_update_stats` the mean and variance alike; `batch_norm_elemt` and
`batch_norm_backward_elemt` a tensor like the input; `batch_norm_backward_reduce` sum_dy and
sum_dy_xmu like the mean and the weight's and bias's gradients `[C]` (made whatever its flags ask:
four `[C]` vectors). The channels-last kernels' staging buffers (grid.y > 1) are not counted.

`_nested_tensor_from_mask_left_aligned` (nn.TransformerEncoder's test, in inference with a padding
mask, whether its fast path may drop the padding into a nested tensor) answers False: the
encoder runs its padded path, whose memory holds every padded position (at least what the nested
one holds), and the output says so. Nested tensors have no meta form here.
"""
from __future__ import annotations

import torch

IN_PLACE = ("_fused_adam_.tensor_lr", "_fused_adamw_.tensor_lr", "_fused_sgd_", "_fused_sgd_.tensor_lr",
            "_fused_adagrad_", "_fused_adagrad_.tensor_lr", "_fused_adam_", "_fused_adamw_",
            "_amp_foreach_non_finite_check_and_unscale_")
RETURNS_SELF = ("_amp_update_scale_",)
LIKE_LOG_PROBS = ("_ctc_loss_backward", "_ctc_loss_backward.Tensor")
NOT_NESTED = ("_nested_tensor_from_mask_left_aligned",)
OUT_OF_DEFAULT = ("_scaled_mm.out",)   # out= overloads whose default overload has a Meta kernel
NESTED_NOTE = ("nn.TransformerEncoder's fast path in inference (the padding dropped into a nested tensor) is not "
               "modelled: its padded path stands in (every padded position held)")

def _nothing(*args, **kwargs):
    return None


def _first(*args, **kwargs):
    return args[0]


def _like_log_probs(grad, log_probs, *args, **kwargs):
    return torch.empty_like(log_probs, memory_format=torch.contiguous_format)


def _accumulate(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _stats_pair(like: torch.Tensor, channels: int) -> tuple:
    dtype = _accumulate(like.dtype)
    return like.new_empty((channels,), dtype=dtype), like.new_empty((channels,), dtype=dtype)


def _bn_stats(input, *args, **kwargs):            # batch_norm_stats, batch_norm_update_stats
    return _stats_pair(input, input.shape[1])


def _bn_gathered(input, mean, *args, **kwargs):   # batch_norm_gather_stats(_with_counts)
    return _stats_pair(mean, mean.shape[-1])


def _bn_elemt(input, *args, **kwargs):
    return torch.empty_like(input)


def _bn_backward_elemt(grad_out, input, *args, **kwargs):
    return torch.empty_like(input)


def _bn_backward_reduce(grad_out, input, mean, invstd, weight, *args, **kwargs):
    grad_dtype = weight.dtype if weight is not None else mean.dtype
    return (torch.empty_like(mean), torch.empty_like(mean),
            mean.new_empty(mean.shape, dtype=grad_dtype), mean.new_empty(mean.shape, dtype=grad_dtype))


SYNC_BN = {"batch_norm_stats": _bn_stats, "batch_norm_update_stats": _bn_stats,
           "batch_norm_gather_stats": _bn_gathered, "batch_norm_gather_stats_with_counts": _bn_gathered,
           "batch_norm_elemt": _bn_elemt, "batch_norm_backward_reduce": _bn_backward_reduce,
           "batch_norm_backward_elemt": _bn_backward_elemt}   # SyncBatchNorm's ops -> their Meta kernels


def _out_of_default(op_name: str):
    """The Meta kernel of `op_name`'s out= overload: the default overload's result, into `out`."""
    def kernel(*args, out, **kwargs):
        result = getattr(torch.ops.aten, op_name).default(*args, **kwargs)
        out.resize_(result.shape)
        return out
    return kernel


def _not_nested(*args, **kwargs) -> bool:
    from .. import notes

    notes.record(notes.NOT_MODELLED, NESTED_NOTE)
    return False


def _exists(name: str) -> bool:
    packet, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, packet, None)
    return packet is not None and (overload or "default") in packet.overloads()


class MetaKernels:
    """Context manager: the Meta kernels torch lacks, registered on enter, removed on exit (a session
    inside another registers none: the outer one's are there)."""

    def __init__(self) -> None:
        self.library = None
        self.registered: list[str] = []

    def __enter__(self) -> "MetaKernels":
        kernels = [(name, kernel) for names, kernel in ((IN_PLACE, _nothing), (RETURNS_SELF, _first),
                                                        (LIKE_LOG_PROBS, _like_log_probs), (NOT_NESTED, _not_nested))
                   for name in names]
        kernels += [(name, _out_of_default(name.partition(".")[0])) for name in OUT_OF_DEFAULT]
        kernels += list(SYNC_BN.items())
        for name, kernel in kernels:
            if _exists(name) and not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "Meta"):
                if self.library is None:
                    self.library = torch.library.Library("aten", "IMPL")
                self.library.impl(name, kernel, "Meta")
                self.registered.append(name)
        return self

    def __exit__(self, *exc) -> None:
        if self.library is not None:
            self.library._destroy()
            self.library = None
