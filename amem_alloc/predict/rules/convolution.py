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

Memory format: cuDNN computes in, and returns its outputs in, `cudnn_conv_suggest_memory_format
(input, weight)`: channels-last when either the input or the weight is (ConvUtils.h), asked of
torch itself (`torch._C._conv_determine_backend_memory_format`). The meta kernel of `convolution`
leaves its output contiguous ("meta tensors have no device info"), so `layout` restrides it, and a
channels-last model stays channels-last, as on a GPU. An input or weight not in that format is
copied to it for the call (`input.contiguous(backend_memory_format)` in Convolution.cpp, the
weight in cudnn_convolution_forward_out and the backward), a temporary taken here too.
"""
from __future__ import annotations

import torch

from . import platform
from .registry import Stage, aten_op, rule
from .scratch import Scratch, nbytes

_HALF = (torch.float16, torch.bfloat16)
_WHY = "estimated: NCHW tensors transposed to NHWC for tensor-core engines; cuDNN's choice is unknown"


@rule(Stage.KERNEL, aten_op("convolution"), source="aten/src/ATen/native/cudnn/Conv_v8.cpp")
def forward(args, kwargs, s: Scratch, session) -> None:
    x, w = args[0], args[1]
    stride, padding, dilation, transposed, output_padding, groups = (_arg(args, kwargs, i, n) for i, n in _FWD)
    if not _cudnn(x, w, groups, transposed):
        return
    session.uses("cudnn")
    fmt = memory_format(x, w, groups, transposed)
    _copies(s, fmt, x, w)
    y = out_shape(x.shape, w.shape, stride, padding, dilation, transposed, output_padding, groups)
    s.estimate(workspace(x, fmt, (x.shape, y, w.shape), session), "cuDNN convolution workspace, forward", _WHY)


@rule(Stage.KERNEL, aten_op("convolution_backward"), source="aten/src/ATen/native/cudnn/Conv_v8.cpp")
def backward(args, kwargs, s: Scratch, session) -> None:
    dy, x, w = args[0], args[1], args[2]
    transposed, groups = _arg(args, kwargs, 7, "transposed"), _arg(args, kwargs, 9, "groups")
    mask = _arg(args, kwargs, 10, "output_mask")
    if not _cudnn(x, w, groups, transposed):
        return
    session.uses("cudnn")
    fmt = memory_format(x, w, groups, transposed)
    _copies(s, fmt, x, w)
    if not dy.is_contiguous(memory_format=fmt):
        s.take(nbytes(dy.shape, dy.dtype), "grad_output.contiguous")
    if mask[0]:
        data = s.estimate(workspace(x, fmt, (dy.shape, x.shape, w.shape), session),
                          "cuDNN convolution workspace, backward data", _WHY)
        s.give(data)
    if mask[1]:
        s.estimate(workspace(x, fmt, (x.shape, dy.shape, w.shape), session),
                   "cuDNN convolution workspace, backward filter", _WHY)


@rule(Stage.LAYOUT, aten_op("convolution"), source="aten/src/ATen/native/Convolution.cpp")
def layout(args, kwargs, out):
    """`convolution`'s output in the memory format cuDNN returns it in (the meta kernel's is
    always contiguous): a fresh meta tensor of the same shape, restrided."""
    x, w = args[0], args[1]
    transposed, groups = _arg(args, kwargs, 6, "transposed"), _arg(args, kwargs, 8, "groups")
    if not isinstance(out, torch.Tensor) or not _cudnn(x, w, groups, transposed):
        return out
    fmt = memory_format(x, w, groups, transposed)
    if out.dim() not in (4, 5) or out.is_contiguous(memory_format=fmt):
        return out
    return torch.empty_like(out, memory_format=fmt)


def memory_format(x, w, groups: int, transposed: bool) -> torch.memory_format:
    """The layout cuDNN computes in and returns (cudnn_conv_suggest_memory_format: channels-last
    when the input or the weight is), as torch's own Convolution.cpp determines it."""
    backend = torch._C._ConvBackend.CudnnTranspose if transposed else torch._C._ConvBackend.Cudnn
    return torch._C._conv_determine_backend_memory_format(x, w, backend)


def _copies(s: Scratch, fmt, x, w) -> None:
    """The input and weight copied into the format cuDNN computes in, for the call."""
    for t, what in ((x, "input.contiguous"), (w, "weight.contiguous")):
        if not t.is_contiguous(memory_format=fmt):
            s.take(nbytes(t.shape, t.dtype), what)


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
    # a channels-last depthwise convolution goes to cuDNN (use_cudnn_depthwise)
    return not depthwise or memory_format(x, w, groups, transposed) != torch.contiguous_format


def tensor_cores(dtype, session) -> bool:
    major = platform.of(session).major
    return (dtype in _HALF and major >= 7) or (dtype == torch.float32 and major >= 8
                                                 and torch.backends.cudnn.allow_tf32)


def workspace(x, fmt, shapes, session) -> int:
    """The rule: the tensors' bytes (in the conv's dtype) for a tensor-core conv that cuDNN
    computes channels-first (`fmt`, memory_format's answer)."""
    if not tensor_cores(x.dtype, session) or fmt != torch.contiguous_format:
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
