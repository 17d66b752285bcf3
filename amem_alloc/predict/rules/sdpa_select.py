"""Which kernel `scaled_dot_product_attention` runs on CUDA: a port of torch's backend choice.

Design note
-----------
torch picks the backend at run time (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp,
`select_sdp_backend`): it walks a priority order and takes the first backend whose every check
passes (`can_use_cudnn_attention`, `can_use_flash_attention`, `can_use_mem_efficient_attention`,
math if enabled). The checks shared with the CPU path are in
aten/src/ATen/native/transformers/sdp_utils_cpp.h. Each check below is one function named after
torch's, in torch's order; nested tensors are not modelled (prediction takes dense inputs).

The priority order is the context's (`torch._C._get_sdp_priority_order()`, default flash,
efficient, math, cuDNN), except that on the first call torch puts cuDNN first when
`check_prefer_cudnn_attention()` holds: cuDNN newer than 9.15.0, compute capability 9.x or 10.x
(CUDA 12 builds: minor 0 or 3 only), and TORCH_CUDNN_SDPA_DEPRIORITIZED unset. Here that
happens whenever the context still holds torch's default order (torch would also overwrite an
order the user set before the first call; that difference is kept out).

Version notes. The checks follow the torch installed here (2.14 when written: its binary has the
same messages and template instantiations). Two things arrived late and are gated on the torch
release (`_late_gqa`, first assumed in 2.13): the memory-efficient kernel accepting
grouped-query attention, and every fused kernel accepting K/V with one head without
`enable_gqa` (`check_batch_size_and_num_heads_dense<.., supports_mqa>`, pytorch#191085). In torch
2.11 GQA runs only on flash and cuDNN. cuDNN's head-dimension limit of 256 also needs a cuDNN
frontend of 1.24 or later in torch's build, which torch does not report: taken as present from
2.13 on.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ...user_script import for_the_script
from .platform import Platform

MATH, FLASH, EFFICIENT, CUDNN, OVERRIDEABLE = 0, 1, 2, 3, 4
NAMES = {MATH: "math", FLASH: "flash", EFFICIENT: "efficient", CUDNN: "cudnn"}
_DEFAULT_ORDER = [FLASH, EFFICIENT, MATH, CUDNN, OVERRIDEABLE]
_CUDNN_FIRST = [CUDNN, FLASH, EFFICIENT, MATH]
_HALF = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Params:
    """sdp_params, with the grad mode read when the call was made."""
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    attn_mask: torch.Tensor | None
    dropout: float
    is_causal: bool
    enable_gqa: bool
    grad_enabled: bool

    @property
    def requires_grad(self) -> bool:
        """input_requires_grad: an input needs a gradient and grad mode is on."""
        return self.grad_enabled and any(t.requires_grad for t in (self.query, self.key, self.value))


def select(p: Params, plat: Platform) -> str:
    """"cudnn", "flash", "efficient" or "math" (select_sdp_backend); raises as torch does when none
    is enabled or viable."""
    if not any((torch._C._get_math_sdp_enabled(), torch._C._get_flash_sdp_enabled(),
                torch._C._get_mem_efficient_sdp_enabled(), torch._C._get_cudnn_sdp_enabled())):
        raise for_the_script(RuntimeError("No viable backend for scaled_dot_product_attention was found."))
    for backend in priority_order(plat):
        if backend == CUDNN and can_use_cudnn(p, plat):
            return "cudnn"
        if backend == FLASH and can_use_flash(p, plat):
            return "flash"
        if backend == EFFICIENT and can_use_efficient(p, plat):
            return "efficient"
        if backend == MATH and torch._C._get_math_sdp_enabled():
            return "math"
    raise for_the_script(RuntimeError("No available kernel. Aborting execution."))   # as torch, for the script


def priority_order(plat: Platform) -> list[int]:
    order = list(torch._C._get_sdp_priority_order())
    if order == _DEFAULT_ORDER and prefer_cudnn(plat):
        return _CUDNN_FIRST
    return order


def prefer_cudnn(plat: Platform) -> bool:
    """check_prefer_cudnn_attention (torch 2.10 and later)."""
    if os.environ.get("TORCH_CUDNN_SDPA_DEPRIORITIZED", "").upper() in ("1", "ON", "YES", "TRUE", "Y"):
        return False
    if plat.torch_version < (2, 10) or plat.cudnn_version <= 91500 or plat.major not in (9, 10):
        return False
    return plat.cuda_version >= 13000 or plat.minor in (0, 3)


# ============================================================================ the three kernels
def can_use_flash(p: Params, plat: Platform) -> bool:
    return (torch._C._get_flash_sdp_enabled()
            and check_tensor_shapes(p)
            and p.attn_mask is None                                  # check_for_attn_mask
            and check_head_dim_size_flash(p)
            and _sm_between(plat, (8, 0), (12, 1))                   # check_flash_attention_hardware_support
            and check_requires_grad_and_head_dim_gt192(p, plat)
            and check_flash_causal_non_square_seqlens(p)
            and check_dtypes_flash(p, plat)
            and check_batch_size_and_num_heads_dense(p, plat, gqa=True, same_heads=True)
            and check_nonzero_sequence_lengths_dense(p)
            and check_last_dim_stride_equals_1_dense(p, ignore_singleton_dim=True))


def can_use_efficient(p: Params, plat: Platform) -> bool:
    dtypes = (torch.float16, torch.float32, torch.bfloat16) if plat.major >= 8 else (torch.float16, torch.float32)
    return (torch._C._get_mem_efficient_sdp_enabled()
            and _sm_between(plat, (5, 0), (12, 1))                   # check_mem_efficient_hardware_support
            and check_tensor_shapes(p)
            and check_head_dim_size_mem_efficient(p, plat)
            and check_data_ptr_alignment_mem_efficient(p, plat)
            and check_nonzero_sequence_lengths_dense(p)
            and check_last_dim_stride_equals_1_dense(p, ignore_singleton_dim=False)
            and check_batch_size_and_num_heads_dense(p, plat, gqa=_late_gqa(plat), same_heads=True)
            and check_tensor_dtype(p, dtypes))


def can_use_cudnn(p: Params, plat: Platform) -> bool:
    v = plat.cudnn_version
    if v < 90000:   # not built with cuDNN, or cuDNN older than 9.0: no cuDNN attention
        return False
    if p.dropout > 0.0 and 91100 < v < 91400:
        return False
    return (torch._C._get_cudnn_sdp_enabled()                        # check_runtime_disabled_cudnn
            and check_tensor_shapes(p)
            and check_cudnn_deterministic()
            and check_dtypes_low_precision(p, plat)
            and check_attn_mask_shape(p)
            and _sm_between(plat, (8, 0), (12, 1))                   # check_cudnn_hardware_support
            and p.dropout * 16.0 == int(p.dropout * 16.0)            # check_cudnn_dropout
            and check_nonzero_sequence_lengths_dense(p)
            and check_last_dim_stride_equals_1_dense(p, ignore_singleton_dim=True)
            and check_batch_size_and_num_heads_dense(p, plat, gqa=True, same_heads=False)
            and check_cudnn_tensor_shapes(p, plat)
            and check_cudnn_d256_bprop_head_dim(p, plat))


# ============================================================================ the checks
def _late_gqa(plat: Platform) -> bool:
    """Memory-efficient GQA and implicit MQA (pytorch#191085): assumed from torch 2.13."""
    return plat.torch_version >= (2, 13)


def _sm_between(plat: Platform, low: tuple[int, int], high: tuple[int, int]) -> bool:
    """check_sm_version<low, high>: the capability lies in [low, high]."""
    return low <= tuple(plat.capability) <= high


def check_tensor_shapes(p: Params) -> bool:
    return p.query.dim() == p.key.dim() == p.value.dim() == 4


def check_tensor_dtype(p: Params, allowed) -> bool:
    return p.query.dtype == p.key.dtype == p.value.dtype and p.query.dtype in allowed


def check_dtypes_low_precision(p: Params, plat: Platform) -> bool:
    return check_tensor_dtype(p, _HALF if plat.major >= 8 else (torch.float16,))


def check_dtypes_flash(p: Params, plat: Platform) -> bool:
    fa3 = getattr(torch._C, "_get_fa3_sdp_enabled", lambda: False)
    if plat.major >= 9 and fa3():
        return check_tensor_dtype(p, (torch.float8_e4m3fn, *_HALF))
    return check_dtypes_low_precision(p, plat)


def check_head_dim_size_flash(p: Params) -> bool:
    """All head dimensions equal and at most 256 (the composite pads them to a multiple of 8)."""
    d = p.query.shape[-1]
    return d == p.key.shape[-1] == p.value.shape[-1] and d <= 256


def minimum_gemm_alignment(p: Params, plat: Platform) -> int:
    is_half = p.query.dtype in _HALF
    use_tensor_cores = plat.major >= 8 or (plat.major >= 7 and is_half)
    align = 4 if plat.major >= 8 else 1
    if use_tensor_cores:
        align = max(align, 128 // (16 if is_half else 32))
    return align


def check_head_dim_size_mem_efficient(p: Params, plat: Platform) -> bool:
    align = minimum_gemm_alignment(p, plat)
    dq, dk, dv = p.query.shape[-1], p.key.shape[-1], p.value.shape[-1]
    return dq == dk and dq % align == 0 and dq > 0 and dv % align == 0 and dv > 0


def check_data_ptr_alignment_mem_efficient(p: Params, plat: Platform) -> bool:
    """From sm80 the kernels need each input's storage offset aligned (the caching allocator's
    base pointers are 512-byte aligned)."""
    if plat.major < 8:
        return True
    align = minimum_gemm_alignment(p, plat) * p.query.element_size()
    return all(t.numel() == 0 or (t.storage_offset() * t.element_size()) % align == 0
               for t in (p.query, p.key, p.value))


def check_requires_grad_and_head_dim_gt192(p: Params, plat: Platform) -> bool:
    """Flash's backward on sm86-89 and sm120-121 cannot take head dims in (192, 224], nor in
    (224, 256] with dropout."""
    if not (p.requires_grad and (_sm_between(plat, (8, 6), (8, 9)) or _sm_between(plat, (12, 0), (12, 1)))):
        return True
    d = p.query.shape[-1]
    return d <= 192 or (p.dropout <= 0.0 and d > 224)


def check_flash_causal_non_square_seqlens(p: Params) -> bool:
    return not p.is_causal or p.query.shape[-2] == p.key.shape[-2]


def check_batch_size_and_num_heads_dense(p: Params, plat: Platform, gqa: bool, same_heads: bool) -> bool:
    """Same batch; with enable_gqa (where the kernel supports it) K/V heads must divide Q's (and be
    equal to each other unless `same_heads` is False: cuDNN); else all head counts equal, or K and V
    with one head each from torch 2.13 on (supports_mqa)."""
    q, k, v = p.query, p.key, p.value
    if not (q.shape[0] == k.shape[0] == v.shape[0]):
        return False
    hq, hk, hv = q.shape[-3], k.shape[-3], v.shape[-3]
    if p.enable_gqa and gqa:
        if same_heads and hk != hv:
            return False
        return hk > 0 and hv > 0 and hq % hk == 0 and (same_heads or hq % hv == 0)
    if hq == hk == hv:
        return True
    return _late_gqa(plat) and hk == 1 and hv == 1 and hq > 0


def check_nonzero_sequence_lengths_dense(p: Params) -> bool:
    return p.query.shape[-2] != 0 and p.key.shape[-2] != 0


def check_last_dim_stride_equals_1_dense(p: Params, ignore_singleton_dim: bool) -> bool:
    ok = all(t.stride(-1) == 1 for t in (p.query, p.key, p.value))
    if ignore_singleton_dim:
        ok = ok or p.query.shape[-1] == 1
    mask_ok = p.attn_mask is None or p.attn_mask.stride(-1) == 1   # GPU backends need it; the CPU does not
    return ok and mask_ok


def check_attn_mask_shape(p: Params) -> bool:
    m = p.attn_mask
    if m is None:
        return True
    if m.requires_grad:
        return False
    b, h, lq, lk = p.query.shape[0], p.query.shape[1], p.query.shape[2], p.key.shape[2]
    if m.shape[-2] not in (lq, 1) or m.shape[-1] not in (lk, 1):
        return False
    if m.dim() == 2:
        return True
    return m.dim() == 4 and m.shape[0] in (1, b) and m.shape[1] in (1, h)


def check_cudnn_deterministic() -> bool:
    return not torch.are_deterministic_algorithms_enabled() or torch.is_deterministic_algorithms_warn_only_enabled()


def _cudnn_supports_d256(plat: Platform) -> bool:
    sm90_or_sm10x = (plat.major == 9 and plat.minor == 0) or plat.major == 10
    unsupported_sm107 = plat.capability == (10, 7) and plat.cudnn_version <= 92500
    frontend_d256 = plat.torch_version >= (2, 13)   # kCuDNNFrontendSupportsD256: cudnn-frontend >= 1.24
    return sm90_or_sm10x and not unsupported_sm107 and plat.cudnn_version > 92200 and frontend_d256


def check_cudnn_tensor_shapes(p: Params, plat: Platform) -> bool:
    b, h = p.query.shape[0], p.query.shape[1]
    if b > 65535 or h > 65535:
        return False
    s_q, s_k = p.query.shape[2], p.key.shape[2]
    d_qk, d_v = p.query.shape[3], p.value.shape[3]
    v = plat.cudnn_version
    if v < 8903 or (v < 8906 and p.dropout != 0.0):
        return False
    sm90_or_sm10x = (plat.major == 9 and plat.minor == 0) or plat.major == 10
    limit = 128
    if _cudnn_supports_d256(plat):
        limit = 256
    elif sm90_or_sm10x and v >= 91100 and d_qk == 192 and d_v == 128:
        limit = 192
    if d_qk > limit or d_v > limit or d_qk % 8 or d_v % 8:
        return False
    if v < 8906 and s_k % 64:
        return False
    if v < 90000 and (s_q < 64 or (p.dropout != 0.0 and (s_q % 64 or s_k % 64))):
        return False
    if s_k == 1:
        return False
    return not (p.dropout != 0.0 and s_q == 1)


def check_cudnn_d256_bprop_head_dim(p: Params, plat: Platform) -> bool:
    if not p.requires_grad or not _cudnn_supports_d256(plat):
        return True
    d_qk, d_v = p.query.shape[3], p.value.shape[3]
    return (d_qk <= 128 and d_v <= 128) or (d_qk, d_v) in ((192, 128), (256, 256))
