"""Cross-entropy under CUDA autocast, op for op as torch's composite runs it.

Design note
-----------
`cross_entropy_loss` (aten/src/ATen/native/LossNLL.cpp) has no autocast kernel: under
`torch.autocast("cuda")` its inner ops meet autocast one by one. `log_softmax` is called with an
explicit `dtype=self.scalar_type()`, and autocast's fp32_set_opt_dtype policy keeps an explicit
dtype, so the log-probabilities stay in the input's float16/bfloat16; `nll_loss` is on the fp32
list, so they are then cast to float32 (a copy autograd records), and the loss is float32. Both
copies are what backward keeps (LogSoftmaxBackward keeps the half-precision result,
NllLossBackward the float32 one). Meta tensors have no autocast kernels, so `cross_entropy` below
writes the composite out in torch calls and runs them under the prediction's torch-function mode,
which applies autocast's lists (autocast.py) to each call, as CUDA's dispatcher would:

* class-index targets: `nll_loss_nd(log_softmax(x, 1, x.dtype), target, weight, reduction,
  ignore_index)`;
* label smoothing (`cross_entropy_loss_label_smoothing`): the same NLL term, plus
  `-(logp [* weight]).sum(1)` (sum is fp32_set_opt_dtype: float32), zeroed where the target is
  ignored, reduced, and mixed `(1 - s) * nll + smooth * s / C`; with a weight and mean reduction
  torch's CUDA path would call `masked_select` (a data-dependent shape), so the weight sum is taken
  as torch's composite-tensor branch does (gather, masked_fill, sum: the same memory, no value);
* probability targets (`cross_entropy_loss_prob_target`): `-(logp * target' [* weight])` summed.
Without autocast torch's own composite runs on the meta tensors as on CUDA, so it is left alone.

CTC loss's backward on CUDA (aten/src/ATen/native/cuda/LossCTC.cu, ctc_loss_backward_gpu_template)
allocates, beside the gradient it returns (meta_kernels.py): `log_beta`, empty like `log_alpha`
(batch x input length x 2 * target length + 1), and the target lengths, input lengths and batch
offsets as int64 tensors of the batch on the device.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .registry import Stage, aten_op, rule

_NAMES = ("input", "target", "weight", "size_average", "ignore_index", "reduce", "reduction", "label_smoothing")


def cross_entropy(args, kwargs, mode):
    """F.cross_entropy as CUDA autocast runs it; the caller's torch-function mode is re-entered so
    that each op meets the autocast lists."""
    p = dict(zip(_NAMES, args))
    p.update(kwargs)
    reduction = p.get("reduction", "mean")
    if p.get("size_average") is not None or p.get("reduce") is not None:
        reduction = torch.nn._reduction.legacy_get_string(p.get("size_average"), p.get("reduce"))
    with mode:
        return _cross_entropy(p["input"], p["target"], p.get("weight"), reduction, p.get("ignore_index", -100),
                              float(p.get("label_smoothing", 0.0)))


def _cross_entropy(x, target, weight, reduction: str, ignore_index: int, smoothing: float):
    class_dim = 0 if x.dim() == 1 else 1
    logp = torch.log_softmax(x, class_dim, dtype=x.dtype)
    if x.shape == target.shape:
        return _prob_target(logp, target, weight, reduction, smoothing, class_dim)
    nll = F.nll_loss(logp, target, weight, ignore_index=ignore_index, reduction=reduction)
    if smoothing <= 0.0:
        return nll
    return _label_smoothing(logp, nll, target, weight, reduction, ignore_index, smoothing, class_dim)


def _label_smoothing(logp, nll, target, weight, reduction, ignore_index, smoothing, class_dim):
    ignore = target == ignore_index
    if weight is not None:
        shape = [1] * logp.dim()
        shape[class_dim] = weight.shape[0]
        smooth = -(logp * weight.view(shape)).sum(class_dim)
    else:
        smooth = -logp.sum(class_dim)
    smooth.masked_fill_(ignore, 0.0)
    if reduction == "mean":
        if weight is not None:
            filtered = target.masked_fill(ignore, 0)
            picked = weight.gather(0, filtered.flatten()).view(filtered.shape)
            ret = smooth.sum() / picked.masked_fill_(ignore.flatten().view(filtered.shape), 0).sum()
        else:
            ret = smooth.sum() / (~ignore).sum()
    elif reduction == "sum":
        ret = smooth.sum()
    else:
        ret = smooth
    return (1 - smoothing) * nll + ret * (smoothing / logp.shape[class_dim])


def _prob_target(logp, target, weight, reduction, smoothing, class_dim):
    classes = logp.shape[class_dim]
    if smoothing > 0.0:
        target = target * (1 - smoothing) + (smoothing / classes)
    term = logp * target
    if weight is not None:
        shape = [1] * logp.dim()
        if logp.dim() > 1:
            shape[1] = weight.shape[0]
        term = term * weight.view(shape) if logp.dim() > 1 else term * weight
    if reduction == "mean":
        return -term.sum() / (logp.numel() / classes)
    if reduction == "sum":
        return -term.sum()
    return -term.sum(class_dim)


@rule(Stage.KERNEL, aten_op("_ctc_loss_backward"), source="aten/src/ATen/native/cuda/LossCTC.cu (ctc_loss_backward_gpu_template)")
def ctc_backward(args, kwargs, scratch, session):
    """log_beta, and the lengths and batch offsets on the device (see the note)."""
    log_alpha = args[6] if len(args) > 6 else kwargs["log_alpha"]
    scratch.take(log_alpha.numel() * log_alpha.element_size(), "log_beta")
    batch = log_alpha.shape[0]
    for what in ("target lengths", "input lengths", "batch offsets"):
        scratch.take(8 * batch, what)
