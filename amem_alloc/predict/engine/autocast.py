"""CUDA's autocast policy, applied to fake CUDA tensors (meta tensors have no autocast kernels).

Design note
-----------
torch.autocast("cuda") sets the thread's CUDA autocast state; the session keeps it on without a
GPU (session.py patches the availability check autocast makes). Real CUDA tensors then pass the
AutocastCUDA dispatch key, which casts the arguments of listed ops (aten/src/ATen/autocast_mode.cpp)
before autograd records the op. Here the same casts are made at the torch-function level, with
the same lists:

* lower precision (matmul family, linear, convolutions, einsum, attention): floating CUDA
  arguments not already in the autocast dtype are cast with `.to(dtype)`; a float32 leaf that
  requires grad (a parameter), not a view, is cast once and cached until the outermost autocast
  exits, as `cached_cast` does (never in inference mode); other tensors are cast every time.
* fp32: lower-precision floating CUDA arguments are cast to float32.
* fp32 with an optional dtype (softmax, log_softmax, sum, prod, cumsum, ...): the op is called
  with dtype=float32 when its first argument is a floating CUDA tensor (no copy: the kernel
  writes float32).
* promote (cat, stack, addcmul, ...): mixed floating arguments are cast to the widest.
* libraries' own autocast kernels: torchvision's RoI ops and deformable convolution run in
  float32 (lower-precision arguments cast) and their outputs are cast back to the input's dtype;
  its `nms` runs in float32 (torchvision/csrc/ops/autocast/). Detection models under
  `torch.autocast` (torchvision's references with `--amp`) call them with half features and
  float32 boxes, which the op itself refuses.

The casts are real ops on the fake tensors, so autograd records their ToCopyBackward nodes and
the recorder sees their allocations, as on CUDA.
"""
from __future__ import annotations

import weakref

import torch

from .. import state

LOWER = {"conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
         "convolution", "_convolution", "prelu", "addmm", "addmv", "addr", "matmul", "__matmul__", "__rmatmul__",
         "einsum", "mm", "mv", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "multi_dot", "linalg_multi_dot",
         "linalg_vecdot", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell", "scaled_dot_product_attention",
         "_scaled_dot_product_flash_attention"}
FP32 = {"acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
        "sinh", "tan", "pow", "__pow__", "__rpow__", "softplus", "layer_norm", "group_norm", "norm", "nuclear_norm",
        "frobenius_norm", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss",
        "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
        "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
        "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
        "rms_norm"}
FP32_OPT_DTYPE = {"prod", "softmax", "log_softmax", "cumprod", "cumsum", "linalg_vector_norm",
                  "linalg_matrix_norm", "sum"}
# ops of libraries whose AutocastCUDA kernel runs them in float32 (torchvision/csrc/ops/autocast/*.cpp:
# `cached_cast(kFloat, ...)` of each floating argument), the outputs cast back to the input's dtype or not
FP32_THEN_BACK = {"torchvision::roi_align", "torchvision::roi_pool", "torchvision::ps_roi_align",
                  "torchvision::ps_roi_pool", "torchvision::deform_conv2d"}
FP32_ONLY = {"torchvision::nms"}
PROMOTE = {"addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sampler", "index_put", "scatter_add",
           "tensordot", "stack", "cat", "concat", "concatenate", "index_copy"}


def _higher_order_casts(name: str) -> bool:
    """Whether torch's higher-order op `name` has an AutocastCUDA kernel that casts its floating
    inputs to the autocast dtype (flex_attention's `_flex_attention_autocast_impl`, in newer torch)."""
    op = getattr(torch.ops.higher_order, name, None)
    return op is not None and torch._C.DispatchKey.AutocastCUDA in getattr(op, "py_kernels", {})


LOWER |= {name for name in ("flex_attention",) if _higher_order_casts(name)}

def active() -> bool:
    return state.current() is not None and torch.is_autocast_enabled("cuda")


def clear_cache() -> None:
    """Drops the emulated cast cache where torch drops its own (torch.clear_autocast_cache)."""
    st = state.current()
    if st is not None:
        st.autocast_cache.clear()


def _eligible(t, mode) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point() and mode.storages.device_of(t) == "cuda"


def _cast(t, dtype, mode):
    if not _eligible(t, mode) or t.dtype == dtype or t.dtype == torch.float64:
        return t
    cacheable = (t.is_leaf and t.requires_grad and dtype != torch.float32 and t.dtype == torch.float32
                 and not t._is_view() and torch.is_autocast_cache_enabled()
                 and not torch.is_inference_mode_enabled())   # torch >= 2.9 never caches in inference mode
    cache = state.current().autocast_cache
    if cacheable:
        hit = cache.get(id(t))
        if hit is not None and hit[0]() is t:
            return hit[1]
    out = t.to(dtype)
    _note_copy(out, mode)
    if cacheable:
        cache[id(t)] = (weakref.ref(t), out)
    return out


def _note_copy(out, mode) -> None:
    """The session's set of storages that autocast's casts made (the verdict shows them apart)."""
    key = mode.storages.key_of(out)
    if key is not None:
        state.current().autocast_keys.add(key)


def _map(x, fn):
    if isinstance(x, (list, tuple)):
        return type(x)(_map(a, fn) for a in x)
    return fn(x)


def call(func, name, args, kwargs, mode):
    from .. import rules as cuda_rules
    lower = torch.get_autocast_dtype("cuda")
    qualified = _qualified(func)
    if qualified in FP32_THEN_BACK or qualified in FP32_ONLY:
        return _in_fp32(func, name, args, kwargs, mode, back=qualified in FP32_THEN_BACK)
    if name in LOWER:
        args, kwargs = _map(args, lambda a: _cast(a, lower, mode)), {k: _map(v, lambda a: _cast(a, lower, mode))
                                                                    for k, v in kwargs.items()}
    elif name in FP32:
        lp = lambda a: _cast(a, torch.float32, mode) if _eligible(a, mode) and a.dtype in (torch.float16, torch.bfloat16) else a
        args, kwargs = _map(args, lp), {k: _map(v, lp) for k, v in kwargs.items()}
    elif name in FP32_OPT_DTYPE and args and _eligible(args[0], mode) and kwargs.get("dtype") is None:
        if not (name in ("softmax", "log_softmax") and len(args) > 2 and args[2] is not None):
            kwargs = {**kwargs, "dtype": torch.float32}
    elif name == "cross_entropy" and args and _eligible(args[0], mode) and args[0].dtype != torch.float32:
        from ..rules import losses
        return losses.cross_entropy(args, kwargs, mode)   # op for op, each meeting these lists
    elif name in PROMOTE:
        tensors = [a for a in torch.utils._pytree.tree_leaves((args, kwargs)) if _eligible(a, mode)]
        if len({t.dtype for t in tensors}) > 1:
            widest = max((t.dtype for t in tensors), key=lambda d: torch.finfo(d).bits)
            args, kwargs = _map(args, lambda a: _cast(a, widest, mode)), {k: _map(v, lambda a: _cast(a, widest, mode))
                                                                         for k, v in kwargs.items()}
    elif mode.opens(func):   # an unlisted Python-level function: the ops in its body meet the lists
        return cuda_rules.function(func, name, args, kwargs, mode)
    with _off():
        return cuda_rules.function(func, name, args, kwargs, mode)


def _qualified(func) -> str | None:
    """"namespace::name" of a torch.ops operator (packet or overload), else None."""
    name = getattr(func, "_qualified_op_name", None)   # OpOverloadPacket
    if name is None and isinstance(func, torch._ops.OpOverload):
        name = func._schema.name
    return name


def _in_fp32(func, name, args, kwargs, mode, back: bool):
    """A library op whose autocast kernel casts its floating arguments to float32, runs the op with
    autocast off, and (back) casts each output to the first argument's dtype."""
    from .. import rules as cuda_rules
    first = args[0] if args else None
    to32 = lambda a: _cast(a, torch.float32, mode) if _eligible(a, mode) else a  # noqa: E731
    args, kwargs = _map(args, to32), {k: _map(v, to32) for k, v in kwargs.items()}
    with _off():
        out = cuda_rules.function(func, name, args, kwargs, mode)
    if not back or not isinstance(first, torch.Tensor):
        return out
    return _map(out, lambda t: t.to(first.dtype) if isinstance(t, torch.Tensor) and t.dtype != first.dtype else t)


class _off:
    """CUDA autocast off inside an op, as the AutocastCUDA kernel excludes its key while it runs."""

    def __enter__(self):
        torch.set_autocast_enabled("cuda", False)

    def __exit__(self, *exc):
        torch.set_autocast_enabled("cuda", True)
