"""CUDA's kernels as CUDA runs them: what they allocate that the meta kernels do not show, or show
differently. One module per concern, each rule from torch's CUDA sources (named in each module):

    cublas.py       the cuBLAS workspace a matmul takes on first use
    dropout.py      the fused dropout kernel and its bool mask
    sdpa_select.py  which attention kernel sdp_utils.cpp picks
    attention.py    the attention composite per kernel, and the kernels' temporaries
    norms.py        cuDNN batch norm where torch picks it
    losses.py       cross-entropy under autocast, op for op (autocast.py calls it)
    embedding.py    embedding backward's sort and segment buffers
    convolution.py  cuDNN convolution workspaces (an estimate by a stated rule)
    meta_kernels.py Meta kernels for CUDA-only ops torch ships without one
    scratch.py      how a rule takes and frees a kernel's temporaries
    platform.py     the card and the installed libraries the rules consult

Design note
-----------
The engine (execution.py) calls four entry points, through cuda_rules.py:

* `function(func, name, args, kwargs, mode)` at the torch-function level, for every call: calls
  that CUDA routes differently from a meta tensor (F.dropout, F.scaled_dot_product_attention,
  batch norm) are answered by calling the ops CUDA runs, so autograd saves what CUDA saves; any
  other call runs as it is (`mode.call`: a Python-level function such as
  F.multi_head_attention_forward with the mode on for its body, so the calls inside it meet these
  rules and autocast too);
* `before_op(func, args, kwargs, session) -> keys` at the dispatch level, before each CUDA op: the
  kernel's own temporaries (scratch.py); the keys returned are freed once the op has run;
* `layout(func, args, kwargs, out) -> out` after a CUDA op's meta kernel: its output restrided
  where CUDA's kernel returns another memory format (convolution.py);
* `host_outputs(func, args, kwargs) -> positions` after a CUDA op: outputs (by position among the
  op's tensor outputs) that CUDA keeps on the host or does not allocate, which the recorder must
  not count as device memory.
Importing the package registers the missing Meta kernels (meta_kernels.py).
"""
from __future__ import annotations

import torch

from . import attention, convolution, cublas, dropout, embedding, meta_kernels, norms
from .cublas import workspace_bytes as cublas_workspace_bytes
from .scratch import Scratch

__all__ = ["function", "before_op", "layout", "host_outputs", "cublas_workspace_bytes"]

meta_kernels.install()

def _sdpa(func, args, kwargs, mode):
    return attention.scaled_dot_product_attention(args, kwargs, mode)


def _dropout(func, args, kwargs, mode):
    return dropout.function(args, kwargs, mode)


def _batch_norm(func, args, kwargs, mode):
    if func is torch.nn.functional.batch_norm or func is torch.batch_norm:
        return norms.batch_norm(func, args, kwargs, mode)
    return None


_FUNCTION = {"dropout": _dropout, "scaled_dot_product_attention": _sdpa, "batch_norm": _batch_norm}

_BEFORE_OP = {
    **{name: cublas.before_op for name in cublas.BLAS_OPS},
    **attention.BEFORE_OP,
    "embedding_dense_backward": embedding.dense_backward,
    "convolution": convolution.forward,
    "convolution_backward": convolution.backward,
}


def function(func, name, args, kwargs, mode):
    """The torch-function level: calls that CUDA routes differently from a meta tensor."""
    rule = _FUNCTION.get(name)
    if rule is not None:
        out = rule(func, args, kwargs, mode)
        if out is not None:
            return out
    return mode.call(func, args, kwargs)   # a Python-level function's body passes the mode too


def before_op(func, args, kwargs, session) -> list:
    """Called for every CUDA op before it runs: the temporaries its CUDA kernel takes that its meta
    kernel does not show. Returns the keys of the ones to free when the op has run."""
    name = func.__name__.partition(".")[0]
    rule = _BEFORE_OP.get(name)
    if rule is None:
        return []
    scratch = Scratch(session, name)
    rule(args, kwargs, scratch, session)
    return scratch.held


_LAYOUT = {"convolution": convolution.layout}


def layout(func, args, kwargs, out):
    """A CUDA op's fresh output in the layout CUDA's kernel gives it where the meta kernel's
    differs (a convolution's channels-last output), before the recorder records it."""
    rule = _LAYOUT.get(func.__name__.partition(".")[0])
    return out if rule is None else rule(args, kwargs, out)


def host_outputs(func, args, kwargs) -> tuple[int, ...]:
    """Positions, among a CUDA op's tensor outputs, of those CUDA does not allocate on the device."""
    return attention.host_outputs(func.__name__.partition(".")[0], args, kwargs)
