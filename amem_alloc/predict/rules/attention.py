"""scaled_dot_product_attention as CUDA runs it: the backend torch picks, the composite around it,
and the temporaries each attention kernel takes.

Design note
-----------
On a meta tensor `F.scaled_dot_product_attention` always takes the math path, and that path is
not even CUDA's: meta tensors count as subclass-like, so the mask is added out of place, and the
composite's `at::dropout` keeps a float noise tensor instead of the fused kernel's bool mask. So
the call is answered here, at the torch-function level, as
aten/src/ATen/native/transformers/attention.cpp (`scaled_dot_product_attention`) runs it on CUDA:

* the backend is sdpa_select.select (a port of sdp_utils.cpp) for the card and the inputs;
* cuDNN: a bool mask becomes an additive one with -65504 (`convert_boolean_attn_mask_cudnn`),
  then `_scaled_dot_product_cudnn_attention`;
* flash: q, k, v padded to a head dim that is a multiple of 8 (`pad_last_dim<8>`), the scale taken
  from the unpadded head dim, `_scaled_dot_product_flash_attention`, the output sliced back;
* memory-efficient: a bool mask becomes additive (-inf), a mask whose strides are not multiples of
  8 is padded and sliced (`preprocess_mask`), expanded to (B, H, L, S), then
  `_scaled_dot_product_efficient_attention`;
* math: `_scaled_dot_product_attention_math`, written out with the same ops (fp16/bf16 upcast to
  float32 unless allowed, GQA's repeat_interleave of K and V, the mask added in place,
  `_safe_softmax`, the fused dropout, the output cast back; its second result is made and
  dropped, as torch does).

Autograd records the same nodes as on CUDA, so what backward keeps is CUDA's. What the kernels
allocate inside, beyond their outputs, is `before_op`'s (scratch.py), each from the CUDA sources:

* flash forward (cuda/flash_attn/flash_api.cpp `mha_fwd`): split-KV accumulators when the
  `num_splits_heuristic` asks for more than one split (no dropout), `softmax_lse_accum`
  [splits, B, H, Lq] and `out_accum` [splits, B, H, Lq, d_rounded] in float32; with dropout, a
  second `rng_state` [2] uint64 replaces the first;
* flash backward (`mha_bwd`; attention_backward.cu `_flash_attention_backward`): contiguous copies
  of grad_out and out when their BSHD view is not contiguous, `softmax_d` [B, H, round128(Lq)] f32
  (computed, returned, dropped), `dq_accum` [B, round128(Lq), H, d_rounded] f32 (deterministic:
  zeros [ceil(SMs / (B*H)), ...]), and for GQA `dk_expanded`/`dv_expanded` [B, Lk, H, d] that are
  summed into dK, dV;
* memory-efficient forward (attention.cu `_efficient_attention_forward`): `output_accum`
  [B, Lq, H, Dv] f32 when the kernel cannot keep the output in registers (fp16/bf16, head dim over
  128: the 32x128x65536 kernel); the philox seed and offset are CPU tensors (no CUDA memory);
* memory-efficient backward (`_efficient_attention_backward`): grad_out's contiguous copy,
  `delta` [B, H, Lq] f32 (fp16/bf16 kernels compute it; fp32 ones take it from
  (grad_out.float() * out.float()).sum(-1)), and the kernel's workspace (the gradQ accumulator,
  estimated);
* cuDNN (aten/src/ATen/native/cudnn/MHA.cpp): the log-sum-exp only when it is computed; the
  backward's frontend workspace (cudnn-frontend CompositeSDPABackwardNode: `softmax_sum`
  [B, H, Lq] f32, `dQ_accum` [B, H, Lq, Dqk] f32, and for GQA the full-head dK/dV), in one
  allocation; cuDNN's own engine workspace cannot be known without cuDNN and is taken as 0;
* `_safe_softmax` (attention.cpp): softmax's output, the -inf test and its row reduction, and
  two scalars, around the final `where`.
"""
from __future__ import annotations

import math

import torch

from . import dropout, platform
from .scratch import Scratch, ceil_div, nbytes, round_up
from .registry import Stage, aten_op, rule
from .sdpa_select import Params, select

aten = torch.ops.aten
_NAMES = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_HALF = (torch.float16, torch.bfloat16)


# ============================================================================ the composite
def scaled_dot_product_attention(args, kwargs, mode):
    """The CUDA output of F.scaled_dot_product_attention, or None to let torch's own call run."""
    p = dict(zip(_NAMES, args))
    p.update(kwargs)
    q, k, v, mask = p["query"], p["key"], p["value"], p.get("attn_mask")
    shards = [_local(t) for t in (q, k, v, mask)]   # a DTensor's kernel runs on this rank's shard
    if not _valid(*shards, mode):
        return None   # torch's own call raises, or it is not a fake CUDA call

    def params(q, k, v, mask):
        return Params(q, k, v, mask, float(p.get("dropout_p", 0.0)), bool(p.get("is_causal", False)),
                      bool(p.get("enable_gqa", False)), torch.is_grad_enabled())
    backend = select(params(*shards), platform.of(mode.session))
    return _RUN[backend](params(q, k, v, mask), p.get("scale"))


def _local(t):
    """A DTensor's shard on this rank (the tensor the kernel is chosen for and runs on); any other
    value as it is. DTensor's own rules then shard the chosen kernel's op, as on the GPU."""
    local = getattr(t, "_local_tensor", None) if type(t).__name__ == "DTensor" else None
    return t if local is None else local


def _valid(q, k, v, mask, mode) -> bool:
    """validate_sdpa_input's conditions, and all inputs fake CUDA tensors."""
    tensors = (q, k, v) + ((mask,) if mask is not None else ())
    if not all(isinstance(t, torch.Tensor) and mode.storages.device_of(t) == "cuda" for t in tensors):
        return False
    return dense_inputs(q, k, v, mask)


def dense_inputs(q, k, v, mask) -> bool:
    """validate_sdpa_input's conditions (dense tensors, one dtype, at least 2-D, a mask of a dtype it takes)."""
    tensors = (q, k, v) + ((mask,) if mask is not None else ())
    if any(t.is_nested for t in tensors) or not (q.dtype == k.dtype == v.dtype):
        return False
    if min(q.dim(), k.dim(), v.dim()) < 2:
        return False
    return mask is None or mask.dtype in (torch.bool, torch.float32, q.dtype)


def _compute_logsumexp(p: Params) -> bool:
    return p.requires_grad   # should_compute_logsumexp


def _cudnn(p: Params, scale):
    mask = p.attn_mask
    if mask is not None and mask.dtype == torch.bool:   # convert_boolean_attn_mask_cudnn
        mask = torch.where(mask.logical_not(), -65504.0, torch.scalar_tensor(0.0, dtype=p.query.dtype))
    return aten._scaled_dot_product_cudnn_attention(p.query, p.key, p.value, mask, _compute_logsumexp(p),
                                                    p.dropout, p.is_causal, False, scale=scale)[0]


def _flash(p: Params, scale):
    head = p.query.shape[-1]
    q, k, v = (_pad_last_dim(t, 8) for t in (p.query, p.key, p.value))
    og_scale = scale if scale is not None else 1.0 / math.sqrt(head)   # calculate_scale on the unpadded query
    out = aten._scaled_dot_product_flash_attention(q, k, v, p.dropout, p.is_causal, False, scale=og_scale)[0]
    return out if out.shape[-1] == head else out[..., :head]           # post_process_flash_output


def _efficient(p: Params, scale):
    mask = _additive_mask(p.attn_mask, p.query.dtype)
    if mask is not None:
        mask = _preprocess_mask(mask, p.query, p.key)
    return aten._scaled_dot_product_efficient_attention(p.query, p.key, p.value, mask, _compute_logsumexp(p),
                                                        p.dropout, p.is_causal, scale=scale)[0]


def _math(p: Params, scale):
    """_scaled_dot_product_attention_math (attention.cpp), op for op."""
    origin = p.query.dtype
    upcast = not torch._C._get_math_sdp_allow_fp16_bf16_reduction()
    q, k, v = (t.to(torch.float32) if upcast and t.dtype in _HALF else t for t in (p.query, p.key, p.value))
    mask = _additive_mask(p.attn_mask, origin)
    negative = scale is not None and scale < 0.0
    factor = math.sqrt(abs(scale) if negative else (scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])))
    query = q * (-factor if negative else factor)
    if p.is_causal:
        causal = torch.ones(query.shape[-2], k.shape[-2], dtype=torch.bool, device=query.device).tril()
        mask = _additive_mask(causal, query.dtype)
    k, v = _repeat_kv(query, k, v, p.enable_gqa)
    attn = torch.matmul(query, k.transpose(-2, -1) * factor)
    if mask is not None:
        attn.add_(mask)
    attn = aten._safe_softmax(attn, -1)
    if p.dropout > 0.0:
        attn = dropout.fused(attn, p.dropout)
    out = torch.matmul(attn, v).to(origin)
    attn.to(origin)   # the op's second result: made, then dropped by scaled_dot_product_attention
    return out


_RUN = {"cudnn": _cudnn, "flash": _flash, "efficient": _efficient, "math": _math}


def run_backend(backend: str, p: Params, scale):
    """The kernel `backend` ("cudnn", "flash", "efficient") called as attention.cpp calls it."""
    return _RUN[backend](p, scale)


def _additive_mask(mask, dtype):
    """convert_boolean_attn_mask: True keeps, False becomes -inf; float masks pass through."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.where(mask.logical_not(), -math.inf, torch.scalar_tensor(0.0, dtype=dtype, device=mask.device))


def _pad_last_dim(t, alignment: int):
    extra = t.shape[-1] % alignment
    return t if extra == 0 else torch.nn.functional.pad(t, (0, alignment - extra))


def _aligned(t, alignment: int) -> bool:
    return all(s % alignment == 0 for s in t.stride()[:-1]) and t.stride(-1) == 1


def _preprocess_mask(mask, query, key):
    if not _aligned(mask, 8):   # pad_bias<8>: always pads, by 8 when the size is already a multiple
        last = mask.shape[-1]
        mask = torch.nn.functional.pad(mask, (0, 8 - last % 8))[..., :last]
    return mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])


def _repeat_kv(query, key, value, enable_gqa: bool):
    """pre_process_group_query_attention_input."""
    hq, hk, hv = query.shape[-3], key.shape[-3], value.shape[-3]
    if not enable_gqa or hq == hk == hv:
        return key, value
    return key.repeat_interleave(hq // hk, -3), value.repeat_interleave(hq // hv, -3)


# ============================================================================ the kernels' temporaries
def _arg(args, kwargs, i: int, name: str, default=None):
    if name in kwargs:
        return kwargs[name]
    return args[i] if len(args) > i else default


@rule(Stage.KERNEL, aten_op("_scaled_dot_product_flash_attention"), source="aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp (mha_fwd)")
def flash_forward(args, kwargs, s: Scratch, session) -> None:
    q, k = args[0], args[1]
    drop = float(_arg(args, kwargs, 3, "dropout_p", 0.0))
    b, h, lq, d = q.shape
    hk, lk = k.shape[1], k.shape[2]
    if lq == 1 and h > hk and drop == 0.0 and d % 8 == 0:   # seqlenq_ngroups_swapped
        lq, h = h // hk, hk
    if drop > 0.0:
        s.take(16, "rng_state")   # the first rng_state, replaced by the one the op returns
        return
    splits = flash_num_splits(b, h, lq, lk, d, platform.of(session).sm_count)
    if splits > 1:
        s.take(nbytes((splits, b, h, lq), torch.float32), "softmax_lse_accum")
        s.take(nbytes((splits, b, h, lq, _flash_rounded(d)), torch.float32), "out_accum")


def _flash_rounded(d: int) -> int:
    size = round_up(d, 8)
    return round_up(size, 32 if size <= 128 else 64)


def flash_num_splits(b: int, h: int, lq: int, lk: int, d: int, sms: int) -> int:
    """set_params_splitkv + num_splits_heuristic (flash_api.cpp), for the standard forward."""
    size = round_up(d, 8)
    block_n = 256 if size <= 64 else (128 if size <= 128 else 64)
    n_blocks = ceil_div(lk, block_n)
    return _num_splits_heuristic(b * h * ceil_div(lq, 64), sms * 2, n_blocks, 128)


def _num_splits_heuristic(batch_nheads_mblocks: int, num_sms: int, num_n_blocks: int, max_splits: int) -> int:
    if batch_nheads_mblocks >= 0.8 * num_sms:
        return 1
    max_splits = min(max_splits, num_sms, num_n_blocks)
    eligible = lambda n: n == 1 or ceil_div(num_n_blocks, n) != ceil_div(num_n_blocks, n - 1)
    efficiency = []
    for n in range(1, max_splits + 1):
        waves = batch_nheads_mblocks * n / num_sms
        efficiency.append(waves / math.ceil(waves) if eligible(n) else 0.0)
    best = max(efficiency, default=0.0)
    for n in range(1, max_splits + 1):
        if eligible(n) and efficiency[n - 1] >= 0.85 * best:
            return n
    return 1


@rule(Stage.KERNEL, aten_op("_scaled_dot_product_flash_attention_backward"), source="flash_api.cpp (mha_bwd), attention_backward.cu")
def flash_backward(args, kwargs, s: Scratch, session) -> None:
    grad_out, q, k, _, out = args[:5]
    _contiguous_copy(s, grad_out.transpose(1, 2), "grad_out.contiguous")
    _contiguous_copy(s, out.transpose(1, 2), "out.contiguous")
    b, h, lq, d = q.shape
    hk, lk = k.shape[1], k.shape[2]
    lq_rounded, d_rounded = round_up(lq, 128), _flash_rounded(d)
    s.take(nbytes((b, h, lq_rounded), torch.float32), "softmax_d")
    if _deterministic():
        splits = ceil_div(platform.of(session).sm_count, b * h)
        s.take(nbytes((splits, b, lq_rounded, h, d_rounded), torch.float32), "dq_accum")
    else:
        s.take(nbytes((b, lq_rounded, h, d_rounded), torch.float32), "dq_accum")
    if hk != h:   # MQA / GQA: dK, dV per query head, then summed over each group
        s.take(nbytes((b, lk, h, d), q.dtype), "dk_expanded")
        s.take(nbytes((b, lk, h, d), q.dtype), "dv_expanded")


@rule(Stage.KERNEL, aten_op("_scaled_dot_product_efficient_attention"), source="aten/src/ATen/native/transformers/cuda/attention.cu")
def efficient_forward(args, kwargs, s: Scratch, session) -> None:
    q, v = args[0], args[2]
    if q.dtype in _HALF and max(q.shape[-1], v.shape[-1]) > 128:   # kNeedsOutputAccumulatorBuffer
        b, h, lq = q.shape[0], q.shape[1], q.shape[2]
        s.take(nbytes((b, lq, h, v.shape[-1]), torch.float32), "output_accum")


@rule(Stage.KERNEL, aten_op("_scaled_dot_product_efficient_attention_backward"), source="aten/src/ATen/native/transformers/cuda/attention_backward.cu")
def efficient_backward(args, kwargs, s: Scratch, session) -> None:
    grad_out, q, _, v, _, out = args[:6]
    _contiguous_copy(s, grad_out.transpose(1, 2), "grad_out.contiguous")
    b, h, lq, d = q.shape
    plat = platform.of(session)
    if q.dtype in _HALF and plat.major != 7:   # kKernelComputesDelta
        s.take(nbytes((b, h, lq), torch.float32), "delta")
    else:   # (grad_out.to(kFloat) * out.to(kFloat)).sum(-1).transpose(-2, -1).contiguous()
        dense = nbytes((b, lq, h, v.shape[-1]), torch.float32)
        casts = [s.take(dense, "delta:grad_out.float"), s.take(dense, "delta:out.float")] if q.dtype != torch.float32 else []
        product = s.take(dense, "delta:product")
        summed = s.take(nbytes((b, lq, h), torch.float32), "delta:sum")
        s.take(nbytes((b, h, lq), torch.float32), "delta")
        for key in (*casts, product, summed):
            s.give(key)
    if plat.major >= 7:   # kEnableSplitKeys: the gradQ accumulator lives in the workspace
        s.estimate(b * h * round_up(lq, 64) * round_up(d, 64) * 4, "memory-efficient attention backward workspace",
                   "the gradQ accumulator, taken as [B, H, round64(Lq), round64(D)] float32")


@rule(Stage.KERNEL, aten_op("_scaled_dot_product_cudnn_attention"), source="aten/src/ATen/native/cudnn/MHA.cpp")
def cudnn_forward(args, kwargs, s: Scratch, session) -> None:
    s.estimate(0, "cuDNN attention forward workspace", "cuDNN's engine chooses it at run time; taken as 0")


@rule(Stage.KERNEL, aten_op("_scaled_dot_product_cudnn_attention_backward"), source="aten/src/ATen/native/cudnn/MHA.cpp")
def cudnn_backward(args, kwargs, s: Scratch, session) -> None:
    grad_out, q, k, v, out = args[:5]
    plat = platform.of(session)
    if grad_out.stride(-1) != 1 or (plat.cudnn_version < 90501 and grad_out.stride() != out.stride()):
        s.take(nbytes(grad_out.shape, grad_out.dtype), "grad_out.permute_to_matching_layout")
    b, h, lq, d_qk = q.shape
    hk, hv, lk, d_v = k.shape[1], v.shape[1], k.shape[2], v.shape[3]
    frontend = nbytes((b, h, lq), torch.float32) + nbytes((b, h, lq, d_qk), torch.float32)
    if hk != h:
        frontend += nbytes((b, h, lk, d_qk), q.dtype)
    if hv != h:
        frontend += nbytes((b, h, lk, d_v), q.dtype)
    s.estimate(frontend, "cuDNN attention backward workspace",
               "cudnn-frontend's softmax_sum and dQ accumulator (and full-head dK/dV for GQA); "
               "the engine's own part is taken as 0")


@rule(Stage.KERNEL, aten_op("_safe_softmax"), source="aten/src/ATen/native/transformers/attention.cpp")
def safe_softmax(args, kwargs, s: Scratch, session) -> None:
    x, dim = args[0], _arg(args, kwargs, 1, "dim", -1)
    dtype = _arg(args, kwargs, 2, "dtype") or x.dtype
    dim = dim % x.dim() if x.dim() else 0
    # all held until the where() result (the op's output) exists, then freed
    s.take(nbytes(x.shape, dtype), "softmax")
    s.take(dtype.itemsize, "neg_inf")
    s.take(x.numel(), "masked")
    s.take(x.numel() // max(1, x.shape[dim]) if x.dim() else 1, "masked_rows")
    s.take(dtype.itemsize, "zero")


def _contiguous_copy(s: Scratch, t, what: str) -> None:
    if not t.is_contiguous():
        s.take(nbytes(t.shape, t.dtype), what)


def _deterministic() -> bool:
    return torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled()




@rule(Stage.HOST_OUTPUTS, aten_op("_scaled_dot_product_efficient_attention"),
      source="aten/src/ATen/native/transformers/cuda/attention.cu")
def efficient_host_outputs(args, kwargs) -> tuple[int, ...]:
    """The philox seed and offset: CPU scalars outside graph capture."""
    return (2, 3)


@rule(Stage.HOST_OUTPUTS, aten_op("_scaled_dot_product_cudnn_attention"), source="aten/src/ATen/native/cudnn/MHA.cpp")
def cudnn_host_outputs(args, kwargs) -> tuple[int, ...]:
    """run_cudnn_SDP_fprop allocates the softmax stats only when asked for the log-sum-exp."""
    return () if _arg(args, kwargs, 4, "compute_log_sumexp", False) else (1,)


@rule(Stage.FUNCTION, "scaled_dot_product_attention", source="aten/src/ATen/native/transformers/attention.cpp")
def sdpa_function(func, args, kwargs, mode):
    return scaled_dot_product_attention(args, kwargs, mode)
