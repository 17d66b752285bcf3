"""What CUDA does that a meta tensor does not: the rules fake execution follows, one module per
concern, each from torch's CUDA sources (named in each module and on each rule), all registered in
registry.py by the op and the stage they apply at:

    registry.py     the registry: Stage, rule(), lookup()
    autograd.py     in-place updates CUDA's autograd engine makes where meta tensors take
                    out-of-place branches (scatter into fresh zeros, gradient accumulation)
    cublas.py       the cuBLAS workspace a matmul takes on first use
    foreach.py      the foreach reductions' partial results (_foreach_norm)
    dropout.py      the fused dropout kernel and its bool mask
    sdpa_select.py  which attention kernel sdp_utils.cpp picks
    attention.py    the attention composite per kernel, and the kernels' temporaries
    flex_attention.py FlexAttention: inductor's fused kernel where compiled, the dense path not
    norms.py        cuDNN batch norm where torch picks it
    losses.py       cross-entropy under autocast, op for op (engine/autocast.py calls it)
    embedding.py    embedding backward's sort and segment buffers
    grouped_mm.py   grouped_mm (MoE experts) in float32, which CUDA's fallback loop takes
    convolution.py  cuDNN convolution workspaces (an estimate by a stated rule)
    data_dependent.py sizes only values decide: what the program fixes (counts, assumed values of
                    a guaranteed structure), and the shape rule for the rest (expected, upper)
    meta_kernels.py Meta kernels for CUDA-only ops torch ships without one (a library the
                    session registers while it runs)
    scratch.py      how a rule takes and frees a kernel's temporaries
    platform.py     the card and the installed libraries the rules consult

Design note
-----------
The engine calls the entry points below, one per stage (registry.py says what each stage's rules
take and return); none of them knows an op by name: each is a lookup.

* `function(func, name, args, kwargs, mode)` at the torch-function level, for every call: a rule
  answers the call (so autograd saves what CUDA saves), or the call runs as it is (`mode.call`: a
  Python-level function such as F.multi_head_attention_forward with the mode on for its body, so
  the calls inside it meet these rules and autocast too);
* `instead_of_op(func, args, kwargs, recorder)` at the dispatch level: an AUTOGRAD rule's result,
  or NOT_APPLICABLE;
* `before_op(func, args, kwargs, session) -> keys` before each CUDA op: the kernel's own
  temporaries (scratch.py); the keys returned are freed once the op has run;
* `layout(func, args, kwargs, out) -> out` after a CUDA op's meta kernel;
* `host_outputs(func, args, kwargs) -> positions` after a CUDA op: outputs CUDA keeps off the device;
* `values(func, args, kwargs, out, known, rule) -> facts` after an op whose inputs are not all known
  (data_dependent.py; its `sizes` is called by engine/values.py for data-dependent sizes).
"""
from __future__ import annotations

from . import attention, autograd, convolution, cublas, data_dependent, dropout, embedding, flex_attention, foreach, grouped_mm, losses, meta_kernels, norms, rnn, shared_memory  # noqa: F401 (register)
from .cublas import workspace_bytes as cublas_workspace_bytes
from .data_dependent import values
from .registry import NOT_APPLICABLE, Stage, lookup
from .scratch import Scratch

__all__ = ["function", "instead_of_op", "before_op", "layout", "host_outputs", "values", "cublas_workspace_bytes",
           "NOT_APPLICABLE", "meta_kernels"]


def function(func, name, args, kwargs, mode):
    """The torch-function level: calls that CUDA routes differently from a meta tensor."""
    found = lookup(Stage.FUNCTION, func)
    if found is not None:
        out = found.fn(func, args, kwargs, mode)
        if out is not None:
            return out
    return mode.call(func, args, kwargs)   # a Python-level function's body passes the mode too


def instead_of_op(func, args, kwargs, recorder):
    """What CUDA's autograd engine does instead of the op (an AUTOGRAD rule), or NOT_APPLICABLE."""
    found = lookup(Stage.AUTOGRAD, func)
    return NOT_APPLICABLE if found is None else found.fn(func, args, kwargs, recorder)


def before_op(func, args, kwargs, session) -> list:
    """Called for every CUDA op before it runs: the temporaries its CUDA kernel takes that its meta
    kernel does not show. Returns the keys of the ones to free when the op has run."""
    found = lookup(Stage.KERNEL, func)
    if found is None:
        return []
    scratch = Scratch(session, func.__name__.partition(".")[0])
    found.fn(args, kwargs, scratch, session)
    return scratch.held


def layout(func, args, kwargs, out):
    """A CUDA op's fresh output in the layout CUDA's kernel gives it where the meta kernel's
    differs (a convolution's channels-last output), before the recorder records it."""
    found = lookup(Stage.LAYOUT, func)
    return out if found is None else found.fn(args, kwargs, out)


def host_inputs(func, args, kwargs) -> bool:
    """Whether a CUDA op's host tensors stay on the host (its kernel reads them there)."""
    found = lookup(Stage.HOST_INPUTS, func)
    return found is not None and found.fn(args, kwargs)


def host_outputs(func, args, kwargs) -> tuple[int, ...]:
    """Positions, among a CUDA op's tensor outputs, of those CUDA does not allocate on the device."""
    found = lookup(Stage.HOST_OUTPUTS, func)
    return () if found is None else found.fn(args, kwargs)
