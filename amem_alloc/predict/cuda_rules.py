"""What CUDA kernels and libraries allocate that the meta kernels do not show, or show differently.

Design note
-----------
Meta kernels return outputs of the shapes and dtypes the CUDA kernels return, so most of an op's
allocations need nothing here. The exceptions, each taken from torch's CUDA sources:

* cuBLAS workspace (aten/src/ATen/cuda/CublasHandlePool.cpp): the first cuBLAS call on a stream
  allocates a workspace through the caching allocator and keeps it for the process's life, one
  per (handle, stream); handles are per thread, so backward (the autograd engine's device
  thread) has its own. Its size is CUBLAS_WORKSPACE_CONFIG's sum of ":SIZE:COUNT" sizes (KiB),
  else 32 MiB on compute capability 9.x/10.x/11.x/12.x, else 4096 KiB * 2 + 16 KiB * 8.
  cuBLASLt calls use the same workspace.
* scaled_dot_product_attention: the backend CUDA would pick (sdp_utils.cpp: flash, then memory-
  efficient, then math) from dtype, head dimension, mask and capability; the flash and efficient
  ops are called directly so their autograd nodes save what CUDA saves (output, logsumexp,
  philox seed and offset). A meta tensor alone would take the math path.
* native_dropout: the meta kernel already returns CUDA's bool mask (the CPU kernel saves a
  float noise tensor instead); nothing to add.
"""
from __future__ import annotations

import os
import re

import torch

MiB = 1 << 20
_BLAS_OPS = {"mm", "addmm", "bmm", "baddbmm", "addmv", "mv", "addbmm", "_addmm_activation", "dot", "vdot",
             "addr", "_scaled_mm", "_int_mm"}


def cublas_workspace_bytes(capability: tuple[int, int]) -> int:
    conf = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    default = 4096 * 8 * 1024 if capability[0] in (9, 10, 11, 12) else 4096 * 1024 * 2 + 16 * 1024 * 8
    if not conf:
        return default
    sizes = re.findall(r":([0-9]+):([0-9]+)", conf)
    return sum(int(size) * 1024 for size, _ in sizes) if sizes else default


def before_op(func, args, kwargs, session) -> list:
    """Called for every CUDA op before it runs: allocations the CUDA kernel makes that its meta
    kernel does not show. Returns the keys of the ones to free when the op has run."""
    name, _, overload = func.__name__.partition(".")
    if name in _BLAS_OPS:
        session._cublas_workspace()
    return []


# ============================================================================ attention
def sdpa_backend(q, k, v, attn_mask, dropout_p, capability) -> str:
    """"flash", "efficient" or "math": what torch's sdp_utils picks on a CUDA device of this
    capability, for inputs that already passed autocast."""
    if not (q.dim() == k.dim() == v.dim() == 4):
        return "math"
    head, major = q.shape[-1], capability[0]
    same_head = k.shape[-1] == head and v.shape[-1] == head
    if (q.dtype in (torch.float16, torch.bfloat16) and attn_mask is None and same_head and head <= 256
            and head % 8 == 0 and major >= 8 and q.dtype == k.dtype == v.dtype):
        return "flash"
    align = 4 if q.dtype == torch.float32 else 8
    if (major >= 5 and same_head and head % align == 0 and q.dtype == k.dtype == v.dtype
            and (q.dtype != torch.bfloat16 or major >= 8)):
        return "efficient"
    return "math"


def _sdpa(args, kwargs, capability):
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    p = dict(zip(names, args))
    p.update(kwargs)
    q, k, v = p["query"], p["key"], p["value"]
    mask, dropout, causal = p.get("attn_mask"), p.get("dropout_p", 0.0), p.get("is_causal", False)
    scale = p.get("scale")
    backend = sdpa_backend(q, k, v, mask, dropout, capability)
    if backend == "flash" and not p.get("enable_gqa"):
        return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, dropout, causal, False, scale=scale)[0]
    if backend == "efficient" and not p.get("enable_gqa"):
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        if mask is not None and mask.dtype == torch.bool:
            mask = torch.zeros_like(mask, dtype=q.dtype).masked_fill_(mask.logical_not(), float("-inf"))
        return torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, mask, needs_grad, dropout, causal,
                                                                      scale=scale)[0]
    return None


def _dropout(args, kwargs):
    """at::dropout takes the fused native_dropout kernel on CUDA (a bool mask is saved); on any
    other device it multiplies by a float noise tensor. None when the fused kernel is not taken."""
    names = ("input", "p", "training", "inplace")
    p = dict(zip(names, args))
    p.update(kwargs)
    if "train" in p:
        p["training"] = p.pop("train")
    x, prob, train = p["input"], p.get("p", 0.5), p.get("training", True)
    if p.get("inplace") or not train or not (0 < prob < 1) or x.numel() == 0:
        return None
    return torch.ops.aten.native_dropout(x, prob, True)[0]


def function(func, name, args, kwargs, mode):
    """The torch-function level: calls that CUDA routes differently from a meta tensor."""
    if name == "dropout" and args and mode.storages.device_of(args[0]) == "cuda":
        out = _dropout(args, kwargs)
        if out is not None:
            return out
    if name == "scaled_dot_product_attention" and args and mode.storages.device_of(args[0]) == "cuda":
        out = _sdpa(args, kwargs, mode.session.capability)
        if out is not None:
            return out
    return func(*args, **kwargs)
