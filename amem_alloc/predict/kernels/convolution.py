"""cuDNN convolution's workspaces: an estimate by a stated rule, and what else its backward takes.

Design note
-----------
On CUDA, `convolution` goes to cuDNN (aten/src/ATen/native/Convolution.cpp `select_conv_backend`:
a CUDA input, cuDNN available and enabled; depthwise convolutions cuDNN does not take are left
out). Its outputs are what the meta kernels return: `convolution`'s output (the bias is added in
place), `convolution_backward`'s grad_input, grad_weight, grad_bias. Inside, torch's cuDNN v8 API
path (aten/src/ATen/native/cudnn/Conv_v8.cpp) asks cuDNN's heuristics for execution plans (with
`torch.backends.cudnn.benchmark` off: heuristics only, no trial runs), tries them in order and
allocates each plan's `getWorkspaceSize()` through the caching allocator for the duration of the
call; forward, backward-data and backward-filter each take one, one after the other. The size is
the chosen engine's and cannot be known without cuDNN.

The rule used here (an estimate, reported as a note): cuDNN's tensor-core engines compute in NHWC
("Tensor layouts in memory: NCHW vs NHWC", NVIDIA's Convolutional Layers User's Guide: NCHW
tensors are transposed to NHWC for Tensor Core kernels), so a channels-first convolution that runs
on tensor cores (float16/bfloat16 from sm70, float32 as TF32 from sm80 when
`torch.backends.cudnn.allow_tf32`) is given a workspace holding its tensors transposed: forward
x + y + w, backward-data dy + dx + w, backward-filter x + dy + w, in the convolution's dtype. A
channels-last convolution, or one off tensor cores, is given none. `convolution_backward` also
copies grad_output when it is not contiguous in the input's suggested memory format
(`cudnn_convolution_backward`). The backward-data workspace is freed before grad_weight is
allocated on CUDA; here it is freed before the op's outputs are recorded (see scratch.py).
"""
from __future__ import annotations

import torch
import torch._prims_common as prims

from . import platform
from .scratch import Scratch, nbytes

_HALF = (torch.float16, torch.bfloat16)
_WHY = "estimated: NCHW tensors transposed to NHWC for tensor-core engines; cuDNN's choice is unknown"


def forward(args, kwargs, s: Scratch, session) -> None:
    x, w = args[0], args[1]
    stride, padding, dilation, transposed, output_padding, groups = (_arg(args, kwargs, i, n) for i, n in _FWD)
    if not _cudnn(x, w, groups, transposed):
        return
    y = out_shape(x.shape, w.shape, stride, padding, dilation, transposed, output_padding, groups)
    s.estimate(workspace(x, w, (x.shape, y, w.shape), session), "cuDNN convolution workspace, forward", _WHY)


def backward(args, kwargs, s: Scratch, session) -> None:
    dy, x, w = args[0], args[1], args[2]
    transposed, groups = _arg(args, kwargs, 7, "transposed"), _arg(args, kwargs, 9, "groups")
    mask = _arg(args, kwargs, 10, "output_mask")
    if not _cudnn(x, w, groups, transposed):
        return
    fmt = prims.suggest_memory_format(x)
    if not dy.is_contiguous(memory_format=fmt):
        s.take(nbytes(dy.shape, dy.dtype), "grad_output.contiguous")
    if mask[0]:
        data = s.estimate(workspace(x, w, (dy.shape, x.shape, w.shape), session),
                          "cuDNN convolution workspace, backward data", _WHY)
        s.give(data)
    if mask[1]:
        s.estimate(workspace(x, w, (x.shape, dy.shape, w.shape), session),
                   "cuDNN convolution workspace, backward filter", _WHY)


_FWD = ((3, "stride"), (4, "padding"), (5, "dilation"), (6, "transposed"), (7, "output_padding"), (8, "groups"))


def _arg(args, kwargs, i: int, name: str):
    return kwargs[name] if name in kwargs else args[i]


def _cudnn(x, w, groups: int, transposed: bool) -> bool:
    """cuDNN runs it: cuDNN available and enabled, a floating input, and not a depthwise
    convolution (torch routes many of those to its own kernels)."""
    if not (torch.backends.cudnn.is_available() and torch.backends.cudnn.enabled):
        return False
    if x.dtype not in (*_HALF, torch.float32, torch.float64) or x.dim() not in (3, 4, 5):
        return False
    depthwise = groups > 1 and not transposed and w.shape[0] % x.shape[1] == 0 and x.shape[1] == groups
    return not depthwise


def tensor_cores(dtype, session) -> bool:
    major = platform.of(session).major
    return (dtype in _HALF and major >= 7) or (dtype == torch.float32 and major >= 8
                                                 and torch.backends.cudnn.allow_tf32)


def workspace(x, w, shapes, session) -> int:
    """The rule: the tensors' bytes (in the conv's dtype) for a channels-first tensor-core conv."""
    if not tensor_cores(x.dtype, session) or prims.suggest_memory_format(x) != torch.contiguous_format:
        return 0
    return sum(nbytes(shape, x.dtype) for shape in shapes)


def out_shape(x, w, stride, padding, dilation, transposed, output_padding, groups) -> tuple[int, ...]:
    """The output's shape (conv_output_size / conv_input_size in ConvUtils.h)."""
    spatial = len(x) - 2
    pick = lambda v, i: v[i] if len(v) > 1 else v[0]
    out = [x[0], w[1] * groups if transposed else w[0]]
    for i in range(spatial):
        size, k = x[i + 2], w[i + 2]
        st, pad, dil = pick(stride, i), pick(padding, i), pick(dilation, i)
        if transposed:
            out.append((size - 1) * st - 2 * pad + dil * (k - 1) + pick(output_padding, i) + 1)
        else:
            out.append((size + 2 * pad - dil * (k - 1) - 1) // st + 1)
    return tuple(out)
