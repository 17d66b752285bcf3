"""grouped_mm (mixture-of-experts layers) in float32: CUDA's kernel takes it, torch's meta kernel does not.

Design note
-----------
`torch.nn.functional.grouped_mm` calls `aten._grouped_mm`. On CUDA (aten/src/ATen/native/cuda/
GroupedBlas.cpp, GroupedMMUtils.h) bfloat16 inputs on sm90/sm100 take CUTLASS's grouped GEMM; any
other float dtype, float32 among them, takes `_grouped_mm_fallback`, a loop of `mm_out` into the
output made first by `create_grouped_gemm_output_tensor`: no memory beyond that output. torch's
meta kernel (torch/_meta_registrations.py `_meta_grouped_mm_common`) refuses every dtype but
bfloat16 and float16, so an fp32 MoE model (transformers' Mixtral and Qwen2-MoE take grouped_mm by
default on sm90) failed under prediction where the GPU runs it. For float32 the output is made
here as `create_grouped_gemm_output_tensor` makes it: the shape of the two operands' layout (2D or
3D each, groups from `offs`), the last dimension's stride padded to 16 bytes.
"""
from __future__ import annotations

import torch

from .registry import NOT_APPLICABLE, Stage, aten_op, rule

_FALLBACK_DTYPES = (torch.float32,)   # what the meta kernel refuses and the CUDA fallback loop takes


@rule(Stage.AUTOGRAD, aten_op("_grouped_mm.default"),
      source="aten/src/ATen/native/GroupedMMUtils.h (create_grouped_gemm_output_tensor)")
def grouped_mm_fallback(func, args, kwargs, recorder):
    call = dict(zip(("mat_a", "mat_b", "offs", "bias", "out_dtype"), args), **kwargs)
    mat_a, mat_b = call["mat_a"], call["mat_b"]
    if mat_a.dtype not in _FALLBACK_DTYPES or mat_b.dtype != mat_a.dtype:
        return NOT_APPLICABLE
    return output_tensor(mat_a, mat_b, call.get("offs"), call.get("out_dtype") or mat_a.dtype)


def output_tensor(mat_a, mat_b, offs, out_dtype):
    """create_grouped_gemm_output_tensor: (groups,) M x N for 2D x 2D (groups along K), M x N for a
    2D operand and a 3D one, (groups,) M x N batched for 3D x 3D; rows padded to 16 bytes."""
    a_2d, b_2d = mat_a.dim() == 2, mat_b.dim() == 2
    if a_2d and b_2d:
        size = [offs.size(0), mat_a.size(0), mat_b.size(1)]
    elif a_2d:
        size = [mat_a.size(0), mat_b.size(-1)]
    elif b_2d:
        size = [mat_a.size(1), mat_b.size(1)]
    else:
        size = [mat_a.size(0), mat_a.size(1), mat_b.size(-1)]
    alignment = 16 // out_dtype.itemsize
    padded = (size[-1] + alignment - 1) // alignment * alignment
    stride = [size[1] * padded, padded, 1] if a_2d == b_2d else [padded, 1]
    return torch.empty_strided(size, stride, dtype=out_dtype, device=mat_a.device)
