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

With `torch.backends.cudnn.benchmark = True` (Conv_v8.cpp `run_single_conv`, and Conv_v7.cpp the
same way), the first call of each configuration (direction, shapes, dtype, layout, strides,
padding, dilation, groups, determinism, TF32; cached per thread, so backward's, made on the
autograd thread, are its own) searches: `generate_and_filter_plans` asks cuDNN for every candidate
plan, keeps those whose workspace fits the largest block the allocator could give
(`CUDACachingAllocator::cacheInfo`: the device's free memory or the largest cached block),
allocates the largest of their workspaces through the caching allocator (halving on OOM, and
dropping the plans that then do not fit), times the plans in it and frees it; then, by torch's
default (`_cudnn_get_conv_benchmark_empty_cache`, true), `emptyCache()` releases every free cached
segment; then the chosen plan runs with its own workspace. Modelled here: the search's workspace,
freed at once, and the release of the cache (exact: the program gets a release there). The
candidates' sizes are cuDNN's own, so the workspace is an estimate: SEARCH_FACTOR times the
convolution's tensors (x + y + w, in its dtype). On an H200 (torch 2.11, cuDNN 9) the 23 forward
searches of ResNet-50 (batch 32, fp16 autocast; the real snapshot kept in
benchmarks/gpu_runs/h200-2026-11-27) took 0.97 to 2.95 times that, 171.6 MiB at most (the first
convolution): 3 bounds them; the backward searches, not matched one to one, took 11 to 90 MiB. The
search takes at most what is free and shrinks to fit, so it cannot make a run fail that fits
without it; it raises what nvidia-smi shows while it runs, which the device total's peak includes
(and the smallest capacity counts it, which over-states a run whose search comes at its peak).

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
SEARCH_FACTOR = 3
_SEARCH_WHY = (f"estimated: the largest candidate plan's workspace, taken as {SEARCH_FACTOR}x the convolution's "
               "tensors; it takes at most what is free, so it raises the device total's peak but cannot fail the run")


@rule(Stage.KERNEL, aten_op("convolution"), source="aten/src/ATen/native/cudnn/Conv_v8.cpp")
def forward(args, kwargs, s: Scratch, session) -> None:
    x, w = args[0], args[1]
    stride, padding, dilation, transposed, output_padding, groups = (_arg(args, kwargs, i, n) for i, n in _FWD)
    if not runs_on_cudnn(x, w, groups, transposed):
        return
    session.uses("cudnn")
    fmt = memory_format(x, w, groups, transposed)
    _copies(s, fmt, x, w)
    y = out_shape(x.shape, w.shape, stride, padding, dilation, transposed, output_padding, groups)
    shapes = (x.shape, y, w.shape)
    _search(s, session, ("forward", shapes, stride, padding, dilation, groups, x.dtype, fmt), x, shapes)
    s.estimate(workspace(x, fmt, shapes, session), "cuDNN convolution workspace, forward", _WHY)


@rule(Stage.KERNEL, aten_op("convolution_backward"), source="aten/src/ATen/native/cudnn/Conv_v8.cpp")
def backward(args, kwargs, s: Scratch, session) -> None:
    dy, x, w = args[0], args[1], args[2]
    transposed, groups = _arg(args, kwargs, 7, "transposed"), _arg(args, kwargs, 9, "groups")
    mask = _arg(args, kwargs, 10, "output_mask")
    if not runs_on_cudnn(x, w, groups, transposed):
        return
    session.uses("cudnn")
    fmt = memory_format(x, w, groups, transposed)
    _copies(s, fmt, x, w)
    if not dy.is_contiguous(memory_format=fmt):
        s.take(nbytes(dy.shape, dy.dtype), "grad_output.contiguous")
    key = (*(_arg(args, kwargs, i, n) for i, n in ((4, "stride"), (5, "padding"), (6, "dilation"))), groups, x.dtype, fmt)
    if mask[0]:
        shapes = (dy.shape, x.shape, w.shape)
        _search(s, session, ("backward data", shapes, *key), x, shapes)
        data = s.estimate(workspace(x, fmt, shapes, session), "cuDNN convolution workspace, backward data", _WHY)
        s.give(data)
    if mask[1]:
        shapes = (x.shape, dy.shape, w.shape)
        _search(s, session, ("backward filter", shapes, *key), x, shapes)
        s.estimate(workspace(x, fmt, shapes, session), "cuDNN convolution workspace, backward filter", _WHY)


@rule(Stage.LAYOUT, aten_op("convolution"), source="aten/src/ATen/native/Convolution.cpp")
def layout(args, kwargs, out):
    """`convolution`'s output in the memory format cuDNN returns it in (the meta kernel's is
    always contiguous): a fresh meta tensor of the same shape, restrided."""
    x, w = args[0], args[1]
    transposed, groups = _arg(args, kwargs, 6, "transposed"), _arg(args, kwargs, 8, "groups")
    if not isinstance(out, torch.Tensor) or not runs_on_cudnn(x, w, groups, transposed):
        return out
    fmt = memory_format(x, w, groups, transposed)
    if out.dim() not in (4, 5) or out.is_contiguous(memory_format=fmt):
        return out
    return torch.empty_like(out, memory_format=fmt)


def _search(s: Scratch, session, config: tuple, x, shapes) -> None:
    """cudnn.benchmark's search on a configuration's first call on this thread: the largest
    candidate's workspace (an estimate), freed, then the cache released (Conv_v8.cpp)."""
    if not torch.backends.cudnn.benchmark:
        return
    thread = "autograd" if torch._C._current_graph_task_id() != -1 else "main"
    seen = session.cudnn_searched
    plain = lambda v: tuple(int(d) for d in v) if isinstance(v, (list, tuple, torch.Size)) else v  # noqa: E731
    key = (thread, torch.backends.cudnn.deterministic, torch.backends.cudnn.allow_tf32, config[0],
           tuple(plain(shape) for shape in shapes), *(plain(v) for v in config[2:]))
    if key in seen:
        return
    seen.add(key)
    tensors = sum(nbytes(shape, x.dtype) for shape in shapes)
    s.give(s.estimate(SEARCH_FACTOR * tensors, f"cuDNN benchmark search workspace, {config[0]}", _SEARCH_WHY))
    if _empties_cache():
        session.release()


def _empties_cache() -> bool:
    """torch's `_cudnn_get_conv_benchmark_empty_cache()` (true unless the program turned it off);
    a build without the getter (CPU-only) keeps torch's default, true."""
    getter = getattr(torch._C, "_cuda_get_conv_benchmark_empty_cache", None)
    return bool(getter()) if getter is not None else True


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


def runs_on_cudnn(x, w, groups: int, transposed: bool) -> bool:
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
