"""In-place updates that CUDA's autograd engine makes where meta tensors take out-of-place branches.

Design note
-----------
Backward formulas (torch/csrc/autograd/FunctionsManual.cpp) and the engine's gradient buffers
(torch/csrc/autograd/input_buffer.cpp) decide between an in-place and an out-of-place update by
asking whether a tensor is "subclass-like" (areAnyTensorSubclassLike), and meta tensors are: the
kTensorSubclassLike dispatch key set holds the Meta backend bit. So on fake CUDA tensors torch
takes the composite-compliant, out-of-place branch where CUDA takes the in-place one, and each
such place would be one allocation too many. The rules here, at the AUTOGRAD stage (the dispatch
level, instead of the op; only for CUDA ops), make those updates in place, as on CUDA:

* **scatter into fresh zeros.** gather's backward is `new_zeros(...).scatter_add_(...)`, index's
  `new_zeros(...).index_put_(..., accumulate=True)`, a max/min over a dim's
  `zeros(...).scatter_(...)`; the out-of-place op only fills the zeros tensor the formula has just
  made (the previous op, in backward), so it is made in place on it.
* **gradient accumulation.** InputBuffer::accumulate sums the gradients that reach one input in
  place when the buffer holds the only reference to a dense gradient (the "steal" branch); for
  meta tensors it always adds out of place. In backward, an add of two same-shaped dense tensors
  one of which nothing else holds is taken to be that accumulation, and made in place on that one.

"Nothing else holds it" is read from use counts: SOLE_USES below says which and why.
"""
from __future__ import annotations

import torch

from .registry import NOT_APPLICABLE, Stage, aten_op, rule

_ZEROS = {"new_zeros.default", "zeros.default", "zeros_like.default"}
_IN_PLACE = {"scatter_add.default": "scatter_add_.default", "scatter.src": "scatter_.src",
             "scatter.value": "scatter_.value", "index_put.default": "index_put_.default"}
_SOURCE = "torch/csrc/autograd/FunctionsManual.cpp (areAnyTensorSubclassLike branches)"


def _fresh_zeros(t, recorder) -> bool:
    """Whether `t` is the zeros tensor the previous op just made (a backward formula's local result)."""
    return (recorder.last_op in _ZEROS and torch._C._current_graph_task_id() != -1
            and isinstance(t, torch.Tensor) and recorder.storages.key_of(t) == recorder.storages.last_key)


@rule(Stage.AUTOGRAD, *(aten_op(name) for name in _IN_PLACE), source=_SOURCE)
def scatter_into_fresh_zeros(func, args, kwargs, recorder):
    if not args or not _fresh_zeros(args[0], recorder):
        return NOT_APPLICABLE
    return aten_op(_IN_PLACE[func.__name__])(*args, **kwargs)


@rule(Stage.AUTOGRAD, aten_op("add.Tensor"), source="torch/csrc/autograd/input_buffer.cpp (accumulate)")
def accumulate_gradient(func, args, kwargs, recorder):
    if kwargs or len(args) != 2 or not _accumulates(*args):
        return NOT_APPLICABLE
    a, b = args
    out = a.add_(b) if _target(a) else b.add_(a)
    recorder.session.known.forget(out)
    return out


# ============================================================================ "nothing else holds it"
# The use counts (the tensor's own, its storage's) that a gradient held only by the engine's input
# buffer shows when its add reaches the dispatch mode: the buffer's reference, the dispatcher's
# argument stack, the Python wrapper the mode receives and the args tuple holding it, on one
# storage held by the tensor and the wrapper. Read off torch 2.11 to 2.14; tests/
# test_predict_engine.py (gradient accumulation in place) fails if a release changes it.
SOLE_USES = (4, 2)


def _sole(t) -> bool:
    return (t._use_count(), torch._C._storage_Use_Count(t.untyped_storage()._cdata)) == SOLE_USES


def _target(t) -> bool:
    """Whether the engine would add into `t` (non-overlapping and dense, and nothing else holds it)."""
    return _dense(t) and _sole(t)


def _dense(t) -> bool:
    """is_non_overlapping_and_dense: the elements fill their extent exactly, in some dim order."""
    expected = 1
    for size, stride in sorted((d for d in zip(t.shape, t.stride()) if d[0] != 1), key=lambda d: d[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def _accumulates(a, b) -> bool:
    return (torch._C._current_graph_task_id() != -1 and isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
            and a.shape == b.shape and a.dtype == b.dtype and (_target(a) or _target(b)))
