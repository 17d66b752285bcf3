"""FlexAttention as CUDA runs it: the fused kernel inductor generates where the program compiles
flex_attention (as its documentation advises), the dense implementation where it does not.

Design note
-----------
`flex_attention` (torch/nn/attention/flex_attention.py) calls the flex_attention higher-order op
(torch/_higher_order_ops/flex_attention.py), whose autograd implementation traces the score_mod
into forward and joint graphs with make_fx before it runs anything; on fake tensors that tracing
cannot run, and a meta tensor has no kernel to model either way. So the op is answered here, at
the torch-function level, with a custom autograd function per implementation, saving what torch
saves (query, key, value, output, logsumexp and the block mask's tensors):

* fused, inside a region compiled by inductor (torch/_inductor/kernel/flex/flex_attention.py):
  forward allocates the logsumexp and the row maxima [B, Hq, Lq] float32 and the output
  [B, Hq, Lq, Dv] laid out in the query's stride order; the maxima die with the compiled call
  unless returned. Backward: the incoming gradient restrided to the output's layout where
  AOTAutograd expects another (runtime_wrappers.py `coerce_to_expected_memory_format`, by
  `guess_tangent_strides_as_outputs`), `delta` [B, Hq, Lq] float32 (with a logsumexp gradient, that
  gradient scaled and the difference: two more), then the output is released (its last use),
  grad_query in the query's order, grad_value and grad_key [Bq, Hkv, Lkv, D] in the value's and
  key's, summed over the batch where key and value broadcast it. Nothing of size Lq x Lkv.
* dense, anywhere else (`sdpa_dense` / `sdpa_dense_backward`, torch's own functions run op by op
  on the fake tensors): the scores matrix and its softmax, as an uncompiled flex_attention
  materialises them on CUDA; backward takes the score_mod's gradient with torch.func.vjp where
  torch would trace a joint graph (the same elementwise work over the scores).

Under autocast, a torch whose op has an AutocastCUDA kernel casts query, key and value to the
autocast dtype first (`_flex_attention_autocast_impl`); engine/autocast.py lists the op so.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from .registry import Stage, rule

HOP = getattr(torch.ops.higher_order, "flex_attention", None)
_F32 = torch.float32


def casts_under_autocast() -> bool:
    """Whether this torch's flex_attention op casts its inputs under CUDA autocast."""
    from torch._C import DispatchKey
    return HOP is not None and DispatchKey.AutocastCUDA in getattr(HOP, "py_kernels", {})


@dataclass
class _Call:
    """The op's arguments other than query, key, value and the score_mod's buffers."""
    score_mod: Callable
    block_mask: tuple
    scale: float
    kernel_options: dict
    mask_buffers: tuple
    n_score_buffers: int

    def mask_tensors(self) -> list:
        return [t for t in self.block_mask[:-1] if isinstance(t, torch.Tensor)]


_NAMES = ("query", "key", "value", "score_mod", "block_mask", "scale", "kernel_options",
          "score_mod_other_buffers", "mask_mod_other_buffers")


@rule(Stage.FUNCTION, HOP, source="torch/_inductor/kernel/flex/flex_attention.py; torch/_higher_order_ops/flex_attention.py")
def flex_attention(func, args, kwargs, mode):
    p = dict(zip(_NAMES, args))
    p.update(kwargs)
    q, k, v = p["query"], p["key"], p["value"]
    if not all(isinstance(t, torch.Tensor) and mode.storages.device_of(t) == "cuda" for t in (q, k, v)):
        return None   # not a fake CUDA call: torch's own op
    score_buffers = tuple(p.get("score_mod_other_buffers", ()))
    call = _Call(p["score_mod"], p["block_mask"], p["scale"], p["kernel_options"],
                 tuple(p.get("mask_mod_other_buffers", ())), len(score_buffers))
    impl = _Fused if mode.session.inductor_depth else _Dense
    return impl.apply(call, q, k, v, *score_buffers)


# ============================================================================ layouts
def _fill_order(strides) -> list[int]:
    """inductor's get_fill_order: dimensions from the smallest stride up."""
    return sorted(range(len(strides)), key=lambda i: strides[i])


def _like_order(t: torch.Tensor, shape, dtype=None) -> torch.Tensor:
    """A new tensor of `shape` laid out densely in `t`'s stride order (infer_dense_strides), last
    dimension innermost (_permute_strides)."""
    order = _fill_order(t.stride())
    last = len(shape) - 1
    if order[0] != last:
        order.remove(last)
        order.insert(0, last)
    strides, step = [0] * len(shape), 1
    for dim in order:
        strides[dim] = step
        step *= shape[dim]
    return t.new_empty_strided(tuple(shape), tuple(strides), dtype=dtype or t.dtype)


def _stats(q: torch.Tensor) -> torch.Tensor:
    b, h, lq, _ = q.shape
    return q.new_empty((b, h, lq), dtype=_F32)


# ============================================================================ fused (inductor)
class _Fused(torch.autograd.Function):
    @staticmethod
    def forward(ctx, call: _Call, q, k, v, *score_buffers):
        ctx.set_materialize_grads(False)
        lse, maxima = _stats(q), _stats(q)
        out = _like_order(q, (*q.shape[:-1], v.shape[-1]))
        ctx.mark_non_differentiable(maxima)
        ctx.call, ctx.buffer_grads = call, tuple(b.requires_grad for b in score_buffers)
        ctx.save_for_backward(q, k, v, out, lse, *call.mask_tensors(), *score_buffers)
        return out, lse, maxima

    @staticmethod
    def backward(ctx, grad_out, grad_lse, _grad_max):
        saved = list(ctx.saved_tensors)
        ctx.maybe_clear_saved_tensors()
        q, k, v, buffers = saved[0], saved[1], saved[2], _score_buffers(ctx, saved)
        out = saved[3]
        grad_out = _tangent(grad_out, out)
        delta = [_stats(q)]
        if grad_lse is not None:
            delta += [_stats(q), _stats(q)]   # the scaled logsumexp gradient, and delta less it
        del out, saved[3]                     # delta was the output's last use
        dq = _like_order(q, q.shape)
        dv = _like_order(v, (q.shape[0], *v.shape[1:]))
        dk = _like_order(k, (q.shape[0], *k.shape[1:]))
        if k.shape[0] == 1 and q.shape[0] > 1:
            dk, dv = dk.sum(0, keepdim=True), dv.sum(0, keepdim=True)
        return (None, dq, dk, dv) + _buffer_grads(ctx, buffers)


def _tangent(grad_out, out):
    """The output's gradient as the compiled backward takes it (runtime_wrappers.py
    `coerce_to_expected_memory_format`): zeros where none came, a restrided copy where its layout
    is not the one AOTAutograd expects."""
    if grad_out is None:
        return torch.zeros_like(out)
    from torch._functorch import config
    if getattr(config, "guess_tangent_strides_as_outputs", False):
        if grad_out.stride() == out.stride():
            return grad_out
        return out.new_empty_strided(out.shape, out.stride()).copy_(grad_out)
    fmt = torch._prims_common.suggest_memory_format(out)
    return grad_out if grad_out.is_contiguous(memory_format=fmt) else grad_out.contiguous(memory_format=fmt)


def _score_buffers(ctx, saved) -> tuple:
    n = ctx.call.n_score_buffers
    return tuple(saved[len(saved) - n:]) if n else ()


def _buffer_grads(ctx, buffers) -> tuple:
    """Gradients of the score_mod buffers that require one (a learned bias): buffers of their
    shape, as torch's `_new_captured_grad_buffers` makes them."""
    return tuple(torch.empty_like(b) if needs else None for b, needs in zip(buffers, ctx.buffer_grads))


# ============================================================================ dense (uncompiled)
class _Dense(torch.autograd.Function):
    @staticmethod
    def forward(ctx, call: _Call, q, k, v, *score_buffers):
        from torch._higher_order_ops.flex_attention import sdpa_dense
        ctx.set_materialize_grads(False)
        out, lse, maxima = sdpa_dense(q, k, v, call.score_mod, call.block_mask, call.scale, call.kernel_options,
                                      score_buffers, call.mask_buffers)
        ctx.mark_non_differentiable(maxima)
        ctx.call, ctx.buffer_grads = call, tuple(b.requires_grad for b in score_buffers)
        ctx.save_for_backward(q, k, v, out, lse, maxima, *call.mask_tensors(), *score_buffers)
        return out, lse, maxima

    @staticmethod
    def backward(ctx, grad_out, grad_lse, _grad_max):
        from torch._higher_order_ops.flex_attention import sdpa_dense_backward
        call = ctx.call
        saved = ctx.saved_tensors
        q, k, v, out, lse = saved[:5]
        score_buffers = _score_buffers(ctx, saved)
        dq, dk, dv, _ = sdpa_dense_backward(q, k, v, out, lse, grad_out, grad_lse, call.score_mod,
                                            _joint(call.score_mod), call.block_mask, call.scale,
                                            call.kernel_options, score_buffers, call.mask_buffers)
        return (None, dq, dk, dv) + _buffer_grads(ctx, score_buffers)


def _joint(score_mod: Callable) -> Callable:
    """What torch's traced joint graph computes: the score_mod's gradient with respect to the
    score, for the scalars sdpa_dense_backward vmaps it over (None for the indices and buffers)."""
    from torch.nn.attention.flex_attention import _identity

    def joint(score, b, h, m, n, grad, *buffers):
        if score_mod is _identity:
            grad_score = grad
        else:
            _, pullback = torch.func.vjp(lambda s: score_mod(s, b, h, m, n, *buffers), score)
            grad_score = pullback(grad)[0]
        return [grad_score, None, None, None, None, *(None for _ in buffers)]   # a list, as the traced graph returns
    return joint

