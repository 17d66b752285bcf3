"""A compiled region traced as torch.compile traces it: dynamo, AOTAutograd and inductor make
every decision, on torch's own FakeTensorMode with fake CUDA tensors, amem's modes suspended.

What torch decides here and the prediction then replays (compiled.py):

* dynamo's graph of the region (where dynamo breaks it into several, graph_breaks.py runs it graph
  by graph),
  its attention calls given the kernel the card would choose (compile_sdpa.py);
* AOTAutograd's joint graph with inductor's decompositions, partitioned by inductor's partitioner
  (`min_cut_rematerialization_partition`, honouring `torch._functorch.config`, e.g.
  `activation_memory_budget`): the forward graph, whose outputs after the user's are what it saves
  for backward, and the backward graph (compiled eagerly here: `force_non_lazy_backward_lowering`);
* inductor's post-grad passes, lowering, scheduler and wrapper code generation (its fusion, buffer
  reuse and `del`s), with no kernel compiled: the wrapper's `call` is what the replay runs.

With no GPU, torch is told a few things here, each declared and undone after the trace:
the card's properties (inductor's device interface), that Triton can generate code (it is never
run), the backend hash Triton would name, and `torch.autograd.grad`, which AOTAutograd's joint
trace calls and torch's C++ engine cannot run on fake CUDA tensors without a GPU (fake_backward.py).
"""
from __future__ import annotations

import contextlib
import functools
import io
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ...code_files import _AMEM_DIR
from ...patching import PatchSet, declare
from . import compile_sdpa, fake_backward, inductor_replay, wrapper_cache

TRACE_GRAD = declare("torch.autograd", "grad", "while a compiled region is traced: the backward walk in Python "
                     "(torch's engine cannot run fake CUDA tensors without a GPU)")
TRACE_PROPS = declare("torch._dynamo.device_interface.CudaInterface", "get_device_properties (and Worker's)",
                      "while a compiled region is traced: the chosen card's properties for inductor")
TRACE_CAPABILITY = declare("torch.cuda", "get_device_capability, get_device_properties",
                           "while a compiled region is traced: the chosen card's (inductor's lowering and "
                           "code generation ask them; torch's would look for a driver)")
TRACE_TRITON = declare("torch._inductor.scheduler", "has_triton",
                       "while a compiled region is traced: Triton code is generated (never compiled or run)")
TRACE_HOOKS = declare("torch.nn.modules.module", "_global_forward_pre_hooks, _global_forward_hooks",
                      "while a compiled region is traced: the session's module tracking set aside (dynamo "
                      "would trace it into the graph); the region's allocations are labelled by its module")
TRACE_RNG = declare("torch.cuda", "get_rng_state, set_rng_state",
                    "while a compiled region is traced: dynamo saves and restores the generator (no stand-in noted)")
TRACE_ACCELERATOR = declare("torch.accelerator", "the functions the shims share with torch.cuda",
                             "while a compiled region is traced: wrappers of their own (dynamo keys handlers by function)")
TRACE_AVAILABLE = declare("torch.cuda", "is_available",
                          "while a compiled region is traced: False, as torch finds it on this machine (the shims "
                          "say True; inductor would then make real CUDA tensors to trace its patterns)")
TRACE_FOLD = declare("torch._inductor.fx_passes.joint_graph.UniformValueConstantFolder", "_deduce_value",
                     "while a compiled region is traced: the one-element values inductor folds are computed "
                     "on the CPU (the same values; there is no GPU to compute them on)")
TRACE_HASH = declare("torch.utils._triton", "triton_hash_with_backend",
                     "while a compiled region is traced: no GPU to name Triton's backend")
TRACE_SPLIT = declare("torch._inductor.runtime.coordinate_descent_tuner.CoordescTuner", "autotune_single_field",
                      "while inductor generates code: the value it starts from is kept (its benchmarks of the "
                      "choices would run kernels on the GPU)")
TRACE_CONV = declare("torch._C", "_select_conv_backend",
                     "while a compiled region is traced: a CUDA convolution cuDNN runs on the card takes cuDNN's "
                     "backend (rules/convolution.py), so torch's fake kernel lays its output out as cuDNN does "
                     "(with no GPU here torch picks its slow kernel, always contiguous)")


@dataclass
class Graph:
    """One graph inductor compiled: its FX module after the partition, and its wrapper's code."""
    gm: Any
    is_backward: bool
    is_inference: bool
    wrapper: str | None = None      # inductor's generated Python wrapper (None: codegen failed)
    wrapper_error: str | None = None
    replay: Any = None              # the wrapper loaded for replay (inductor_replay.Replay)
    kept: bool = False              # the wrapper was kept from an earlier prediction (wrapper_cache.py)


@dataclass
class Trace:
    graphs: list = field(default_factory=list)
    dynamo_graphs: int = 0
    placeholders: list = field(default_factory=list)   # dynamo graph's inputs: the fake tensors passed
    forward_outputs: list = field(default_factory=list)  # the forward's outputs as the fake run made them
    tangents: list | None = None    # forward outputs (by index) the backward takes a gradient of (AOTAutograd's)
    result: Any = None
    error: str | None = None


def props_of(session) -> types.SimpleNamespace:
    """What inductor asks of the card (torch.cuda.get_device_properties' fields)."""
    from .. import gpus

    try:
        sms = gpus.get(session.device_name).multi_processor_count
    except Exception:
        sms = 132
    major, minor = session.capability
    return types.SimpleNamespace(
        name=session.device_name, major=major, minor=minor, total_memory=session.total_memory,
        multi_processor_count=sms, warp_size=32, max_threads_per_multi_processor=2048,
        regs_per_multiprocessor=65536, shared_memory_per_block_optin=232448, shared_memory_per_block=49152,
        shared_memory_per_multiprocessor=233472, L2_cache_size=50 << 20, gcnArchName="NVIDIA CUDA",
        clock_rate=1980000, memory_clock_rate=2619000, memory_bus_width=5120, is_integrated=False)


def _trace_patches(patches: PatchSet, props) -> None:
    from torch._dynamo.device_interface import CudaInterface
    import torch._inductor.scheduler as scheduler
    import torch.utils._triton as triton_utils

    get = staticmethod(lambda *a, **k: props)
    patches.apply(TRACE_GRAD, torch.autograd, "grad", fake_backward.grad)
    patches.apply(TRACE_PROPS, CudaInterface, "get_device_properties", get)
    patches.apply(TRACE_PROPS, CudaInterface.Worker, "get_device_properties", get)
    patches.apply(TRACE_CAPABILITY, torch.cuda, "get_device_capability", lambda *a, **k: (props.major, props.minor))
    patches.apply(TRACE_CAPABILITY, torch.cuda, "get_device_properties", lambda *a, **k: props)
    patches.apply(TRACE_TRITON, scheduler, "has_triton", lambda: True)
    patches.apply(TRACE_HASH, triton_utils, "triton_hash_with_backend", lambda: "amem-predict (no GPU)")
    patches.apply(TRACE_RNG, torch.cuda, "get_rng_state",
                  lambda *a, **k: torch.zeros(16, dtype=torch.uint8, device="cpu"))
    patches.apply(TRACE_RNG, torch.cuda, "set_rng_state", lambda *a, **k: None)
    patches.apply(TRACE_AVAILABLE, torch.cuda, "is_available", lambda: False)
    module = torch.nn.modules.module
    for table in (module._global_forward_pre_hooks, module._global_forward_hooks,
                  module._global_backward_pre_hooks, module._global_backward_hooks):
        patches.set_aside(TRACE_HOOKS, table, lambda k, v: True)
    _distinct_accelerator(patches)
    from torch._inductor.fx_passes.joint_graph import UniformValueConstantFolder as folder
    deduce = folder._deduce_value

    def on_cpu(self, node):
        with _OnCpu():
            return deduce(self, node)
    patches.apply(TRACE_FOLD, folder, "_deduce_value", on_cpu)
    patches.apply(TRACE_CONV, torch._C, "_select_conv_backend", _conv_backend_on_card(torch._C._select_conv_backend))


def _conv_backend_on_card(select):
    """torch's choice of convolution backend, with cuDNN's where the card runs cuDNN (as the eager
    prediction lays out a convolution's output: rules/convolution.py)."""
    from ..rules import convolution

    def on_card(input, weight, *args, **kwargs):
        backend = select(input, weight, *args, **kwargs)
        transposed, groups = bool(kwargs.get("transposed", False)), int(kwargs.get("groups", 1))
        if input.device.type == "cuda" and convolution.runs_on_cudnn(input, weight, groups, transposed):
            return torch._C._ConvBackend.CudnnTranspose if transposed else torch._C._ConvBackend.Cudnn
        return backend
    return on_card


class _OnCpu(TorchDispatchMode):
    """Ops asked for on CUDA run on the CPU (inductor's constant folding of one-element values)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if isinstance(kwargs.get("device"), (str, torch.device)) and torch.device(kwargs["device"]).type == "cuda":
            kwargs["device"] = torch.device("cpu")
        return func(*args, **kwargs)


def _distinct_accelerator(patches: PatchSet) -> None:
    """torch.accelerator's functions that the session's shims made the very ones of torch.cuda get
    wrappers of their own: dynamo keys its handlers by function and refuses one registered twice."""
    for name in dir(torch.accelerator):
        fn = getattr(torch.accelerator, name)
        if callable(fn) and not isinstance(fn, type) and _same(getattr(torch.cuda, name, None), fn):
            patches.apply(TRACE_ACCELERATOR, torch.accelerator, name, functools.wraps(fn)(lambda *a, _f=fn, **k: _f(*a, **k)))


@contextlib.contextmanager
def amem_suspended():
    """amem's torch-function and dispatch modes off (dynamo and torch's fake mode see no spoofing)."""
    from torch.utils._python_dispatch import _disable_current_modes
    from .devices import unspoofed

    popped = []
    while torch._C._len_torch_function_stack() > 0:
        popped.append(torch._C._pop_torch_function_stack())
    try:
        with _disable_current_modes(), unspoofed():
            yield
    finally:
        for mode in reversed(popped):
            torch._C._push_on_torch_function_stack(mode)


# ============================================================================ inductor, codegen only
def _codegen(gm, example_inputs, kw: dict, props) -> tuple[str, bool]:
    """The graph's wrapper source: kept from an earlier prediction of the same graph for the same
    card (wrapper_cache.py), else inductor's (below), then kept; and whether it was kept before."""
    graph_key = wrapper_cache.key(gm, example_inputs, kw, props)
    entry = kept = wrapper_cache.load(graph_key)
    if entry is None:
        entry = _lowered(gm, example_inputs, kw)
        wrapper_cache.store(graph_key, entry)
    _report_output_strides(entry.output_strides)
    from .. import notes

    for what in entry.estimates:
        notes.record(notes.ESTIMATE, what)
    return entry.wrapper, kept is not None


def _lowered(gm, example_inputs, kw: dict) -> wrapper_cache.Entry:
    """Inductor's post-grad passes, lowering, scheduler and wrapper codegen (compile_fx.py's
    fx_codegen_and_compile up to `graph.codegen()`): the wrapper's source, no kernel compiled."""
    import torch._inductor.compile_fx as cfx
    from torch._inductor.debug import DebugContext
    from torch._inductor.graph import GraphLowering
    from torch._inductor.virtualized import V

    is_inference, is_backward = kw.get("is_inference", False), kw.get("is_backward", False)
    cfx.view_to_reshape(gm)
    with torch.no_grad():
        fake_mode = cfx.fake_tensor_prop(gm, example_inputs)
    cfx._recursive_record_original_output_strides(gm)
    with V.set_fake_mode(fake_mode), DebugContext():
        cfx._recursive_post_grad_passes(gm, is_inference=is_inference)
        graph = GraphLowering(gm, example_inputs=example_inputs, shape_env=fake_mode.shape_env,
                              graph_id=kw.get("graph_id"), is_inference=is_inference, is_backward=is_backward,
                              get_decomp_fn=kw.get("get_decomp_fn"))
        with V.set_graph_handler(graph), V.set_extern_kernel_nodes([]), _unbenchmarked_choices() as estimates:
            graph.run(*example_inputs)
            strides = _output_strides(graph)
            return wrapper_cache.Entry(graph.codegen()[0].value, strides, estimates)


SPLIT_ESTIMATE = ("inductor's benchmarks while generating code (coordinate-descent tuning, max-autotune): the split "
                  "of a reduction that reduces both ways (a norm's backward) is chosen on the GPU; inductor's own "
                  "starting split is assumed, and with it the size of the partial sums' workspace")


@contextlib.contextmanager
def _unbenchmarked_choices():
    """Where inductor would benchmark a choice while generating code (the split of a mix-order
    reduction: simd.py), the value it starts from is kept; the estimates made are yielded."""
    try:
        from torch._inductor.runtime.coordinate_descent_tuner import CoordescTuner
    except ImportError:
        CoordescTuner = None
    estimates: list[str] = []
    if CoordescTuner is None or not hasattr(CoordescTuner, "autotune_single_field"):
        yield estimates
        return

    def starting_value(fn, init_val, *args, **kwargs):
        if SPLIT_ESTIMATE not in estimates:
            estimates.append(SPLIT_ESTIMATE)
        return init_val
    with PatchSet() as patches:
        patches.apply(TRACE_SPLIT, CoordescTuner, "autotune_single_field", staticmethod(starting_value))
        yield estimates


def _tangent_outputs() -> list | None:
    """The forward graph's outputs the backward graph takes gradients of, in its order, as
    AOTAutograd chose them (collect_metadata_analysis.py): mutated inputs' new values that need
    a gradient, user outputs that are no alias (a view of an intermediate gets its gradient
    through its base), then the intermediate bases it added. None where torch did not say."""
    from torch._functorch._aot_autograd.schemas import OutputType

    context = torch._guards.TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None)
    if meta is None:
        return None
    out = [k for k, i in enumerate(meta.mutated_inp_runtime_indices)
           if meta.input_info[i].mutates_data and meta.input_info[i].requires_grad]
    base = meta.num_mutated_inp_runtime_indices
    own = (OutputType.non_alias, OutputType.unsafe_view_alias, OutputType.custom_function_view)
    out += [base + j for j, info in enumerate(meta.output_info)
            if info.output_type in own and issubclass(info.raw_type, torch.Tensor) and info.requires_grad_for_backward]
    base += len(meta.output_info)
    return out + [base + j for j in range(meta.num_intermediate_bases)]


def _output_strides(graph) -> list:
    """The strides of the graph's outputs as inductor laid them out (padded, say); None for an
    output that is no tensor."""
    from torch._inductor.ir import IRNode

    return [[int(s) for s in out.get_layout().stride] if isinstance(out, IRNode) and out.has_tensor_output()
            else None for out in graph.graph_outputs or []]


def _report_output_strides(strides: list | None) -> None:
    """The outputs' strides told to AOTAutograd as compile_fx tells it: the backward is then
    lowered for the saved tensors' real strides (graph_compile.py restrides its placeholders)."""
    context = torch._guards.TracingContext.try_get()
    if strides is None or context is None or context.output_strides is None or context.output_strides:
        return
    context.output_strides.extend(tuple(s) if s is not None else None for s in strides)


def _inner(trace: Trace, codegen: bool, props):
    """inductor's inner compile, replaced: the partitioned graph is kept (and its wrapper code
    generated); the fake run goes on by running the graph on the fake tensors."""
    def inner(gm, example_inputs, **kw):
        import copy
        graph = Graph(copy.deepcopy(gm), bool(kw.get("is_backward")), bool(kw.get("is_inference")))
        if not graph.is_backward:
            trace.tangents = _tangent_outputs()
        if codegen:
            try:
                graph.wrapper, graph.kept = _codegen(gm, example_inputs, kw, props)
                graph.replay = inductor_replay.Replay(graph.wrapper, _wrapper_name(graph))
            except Exception as e:   # noted by the caller: the graph replays op by op
                graph.wrapper_error = describe_failure(e)
        trace.graphs.append(graph)
        run_gm = graph.gm

        def run(args):
            outs = run_gm(*args)
            if not graph.is_backward:
                trace.forward_outputs = list(outs)
            return outs
        run._boxed_call = True
        return run
    return inner


# ============================================================================ what needs a GPU to decide
AUTOTUNE_ESTIMATE = ("max-autotune: which GEMM/convolution kernel torch picks is decided by benchmarks on the "
                     "GPU; ATen's kernel is assumed (torch's own pick when it does not benchmark), so a Triton "
                     "template's fused epilogue and workspace are not modelled")


def _autotunes(options: dict | None) -> bool:
    from torch._inductor import config

    options = options or {}
    return any(options.get(k, getattr(config, k)) for k in ("max_autotune", "max_autotune_gemm"))


FUSION_ESTIMATE = ("inductor's fusion decided by benchmarks ({flags}): the kernels would run on the GPU; "
                   "its heuristics' fusions are assumed")
_BENCHMARKED_FUSION = ("benchmark_fusion", "benchmark_combo_kernel")


def _without_benchmarks(options: dict | None) -> dict:
    """inductor's config while tracing: where the region autotunes, ATen's GEMM and convolution
    kernels only, and fusions by inductor's heuristics where it would benchmark them (each choice
    needs kernels run on the GPU); each said."""
    from .. import notes

    changes, estimates = _benchmark_free(options)
    for what in estimates:
        notes.record(notes.ESTIMATE, what)
    return changes


def inductor_options(options: dict | None) -> dict | None:
    """The config patches compile_fx is given for a region: its torch.compile options, with the
    changes that keep inductor from benchmarking over them (compile_fx applies its patches over the
    config, so the user's own would undo the trace's)."""
    return {**options, **_benchmark_free(options)[0]} if options else options


def _benchmark_free(options: dict | None) -> tuple[dict, list[str]]:
    """The config changes that keep inductor from benchmarking, and what each assumes instead."""
    from torch._inductor import config

    options, changes, estimates = options or {}, {}, []
    if _autotunes(options):
        estimates.append(AUTOTUNE_ESTIMATE)
        changes.update(max_autotune_gemm_backends="ATEN", max_autotune_conv_backends="ATEN")
    benchmarked = [k for k in _BENCHMARKED_FUSION if options.get(k, getattr(config, k, False))]
    if benchmarked:
        estimates.append(FUSION_ESTIMATE.format(flags=", ".join(benchmarked)))
        changes.update(dict.fromkeys(benchmarked, False))
    return changes, estimates


def _wrapper_name(graph: Graph) -> str:
    return inductor_replay.WRAPPER_PREFIX + ("backward" if graph.is_backward else "inference" if graph.is_inference else "forward")


def _backend(trace: Trace, options: dict | None, codegen: bool, props):
    import torch._inductor.compile_fx as cfx

    def backend(gm, example_inputs):
        trace.dynamo_graphs += 1
        trace.placeholders = [_example_of(n) for n in gm.graph.nodes if n.op == "placeholder"]
        gm = compile_sdpa.on_card(gm, props)   # attention's kernel as the card picks it
        return cfx.compile_fx(gm, example_inputs, inner_compile=_inner(trace, codegen, props),
                              config_patches=inductor_options(options))
    return backend


def _example_of(node):
    arg = node.meta.get("grapharg")
    return getattr(arg, "example", None) if arg is not None else None


def describe_failure(e: BaseException) -> str:
    """The failure's type and the first line of its message, as a region's note gives it."""
    e = getattr(e, "inner_exception", None) or e   # dynamo's BackendCompilerFailed: the backend's error
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:160]}" if text else type(e).__name__


@contextlib.contextmanager
def quiet_guard_errors():
    """torch logs each guard it could not build with a traceback before raising; the region (or
    that frame) then runs as eager and its note says why, so the log would only repeat it, as if
    an error of the user's run."""
    import logging

    log = logging.getLogger("torch._guards")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def amems_code(frame) -> bool:
    """Whether the frame dynamo is offered runs amem's own code (a compiled region's wrapper,
    called from code dynamo skips, or an inductor wrapper's replay): dynamo must not convert it,
    as it never converts torch.compile's own wrapper, whose file it skips, or inductor's compiled
    code; the region behind it is compiled on its own."""
    name = frame.f_code.co_filename
    return name.startswith(_AMEM_DIR) or name.startswith("<" + inductor_replay.WRAPPER_PREFIX)


class SkipAmemsFrames:
    """dynamo's frame callback, offered no frame of amem's own code (`amems_code`)."""

    def __init__(self, inner):
        self._torchdynamo_orig_backend = inner
        self.inner = inner

    def __call__(self, frame, cache_entry, frame_state):
        if amems_code(frame):
            return as_eager()
        return self.inner(frame, cache_entry, frame_state)


def as_eager():
    """dynamo's answer for a frame it does not convert: run it as it is (this time and after)."""
    from torch._dynamo.types import ConvertFrameReturn

    return ConvertFrameReturn()


def run_traced(call, fake_args: tuple, fake_kwargs: dict, props, options: dict | None, codegen: bool = True) -> Trace:
    """`call(*fake_args, **fake_kwargs)` under dynamo with inductor's partition and codegen (above)."""
    import torch._dynamo
    import torch._inductor.config

    trace = Trace()
    with _said_if_traced(), PatchSet() as patches, torch._functorch.config.patch(force_non_lazy_backward_lowering=True,
                                                              enable_autograd_cache=False), \
            torch._inductor.config.patch(compile_threads=1, **_without_benchmarks(options)):
        _trace_patches(patches, props)
        torch._dynamo.reset()
        _handlers().cache_clear()
        ctx = torch._dynamo.optimize(_backend(trace, options, codegen, props), dynamic=False)
        ctx.callback = SkipAmemsFrames(ctx.callback)
        compiled = ctx(call)
        try:
            with quiet_guard_errors():   # (torch's warning of global module hooks: torch_patches.HOOKS_WARNING)
                trace.result = compiled(*fake_args, **fake_kwargs)
        finally:
            torch._dynamo.reset()
            _handlers().cache_clear()   # built from the functions as patched here
            _card_caches_clear()
    return trace


@contextlib.contextmanager
def _said_if_traced():
    """What the trace writes to stderr, written after it where it succeeds; dropped where it fails
    (the region runs as eager, and its note says why): FSDP1's own assertion prints the whole stack
    before it raises (torch.distributed.utils._p_assert), a screenful for a failure amem recovers from."""
    written = io.StringIO()
    with contextlib.redirect_stderr(written):
        yield
    sys.stderr.write(written.getvalue())


def _card_caches_clear() -> None:
    """What inductor cached of the card told it here (a later prediction may choose another card)."""
    from torch._inductor import utils
    from torch._inductor.runtime.hints import DeviceProperties

    for cached in (utils.is_big_gpu, utils.get_max_num_sms, DeviceProperties.create.__func__):
        getattr(cached, "cache_clear", lambda: None)()


def _same(a, b) -> bool:
    try:
        return a is b or bool(a == b)
    except Exception:
        return False


def _handlers():
    from torch._dynamo.variables.torch import TorchInGraphFunctionVariable

    return TorchInGraphFunctionVariable._get_handlers
