"""The foreach kernels' own temporaries (aten/src/ATen/native/cuda/ForeachReduceOp.cu).

Design note
-----------
`_foreach_norm` on CUDA (`_foreach_tensor_norm_cuda_impl`, the fast route: every tensor dense and
of one dtype, an L1, L2 or inf norm of floating tensors) reduces each tensor in chunks of
kChunkSize = 65536 elements (MultiTensorApply.cuh) and keeps one partial result per chunk:
`output_per_tensor`, zeros of ntensors x (the largest tensor's chunk count) in the output's opmath
type (float32 for fp16, bf16 and fp32; float64 for fp64), `global_output` (320 opmath elements), and
a 0-dim `global_norm`, all freed when the op returns; its outputs are one 0-dim tensor per input,
as the meta kernel makes them. Off the fast route (`foreach_tensor_norm_slow`) it calls
linalg_vector_norm per tensor, whose own reductions the recorder sees.
"""
from __future__ import annotations

import math

import torch

from .registry import Stage, aten_op, rule
from .scratch import Scratch

CHUNK = 65536                       # kChunkSize (aten/src/ATen/native/cuda/MultiTensorApply.cuh)
GLOBAL_OUTPUT = 320                 # at::zeros({320}) in _foreach_tensor_norm_cuda_impl
_OPMATH = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


def _fast_route(tensors, p: float) -> bool:
    """use_slowpath's negation: dense tensors of one dtype, floating, and p in (1, 2, inf)."""
    if not tensors or p not in (1.0, 2.0, math.inf):
        return False
    dtype = tensors[0].dtype
    return all(t.dtype == dtype and t.is_floating_point() and not t.is_complex() and t.is_contiguous()
               for t in tensors)


@rule(Stage.KERNEL, aten_op("_foreach_norm.Scalar"), source="aten/src/ATen/native/cuda/ForeachReduceOp.cu")
def norm(args, kwargs, s: Scratch, session) -> None:
    tensors = list(args[0])
    ord_ = args[1] if len(args) > 1 else kwargs.get("ord", 2)
    p = float(ord_)
    if not _fast_route(tensors, p):
        return
    dtype = kwargs.get("dtype") or (args[2] if len(args) > 2 else None) or tensors[0].dtype
    opmath = _OPMATH.get(dtype, dtype)
    chunks = max(math.ceil(t.numel() / CHUNK) for t in tensors)
    s.take(len(tensors) * chunks * opmath.itemsize, "output_per_tensor")
    s.take(GLOBAL_OUTPUT * opmath.itemsize, "global_output")
    s.take(dtype.itemsize, "global_norm")
