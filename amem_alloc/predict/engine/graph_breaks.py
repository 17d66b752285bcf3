"""A compiled region with graph breaks, run as torch runs it: dynamo itself runs the region over
the session's fake tensors, each graph it captures is predicted as compiled, and the Python
between the graphs (the break, and what dynamo could not put in a graph) runs eager on the
session's tensors, inside the same recorded run.

dynamo's frame conversion (its trace of the region's bytecode and each backend call) runs with
amem's modes suspended, as compile_trace.py traces a whole region; dynamo then runs the frame it
made with amem's modes in place: its guards see the session's tensors, each graph it calls is the
replay of that graph (compiled.py's `Plan`), and the code between graphs runs as eager.

What makes the session's tensors acceptable to dynamo, each a declared patch undone after the call:
their fakes claim CUDA (compile_inputs.py); the guard on the torch-function mode stack is not
installed (amem's modes are on it at run time, not while dynamo traces); a tensor's guard is
built with the Python dispatch keys amem's modes put in thread-local state at run time.
Frames that amem's code enters between graphs (its modes and module hooks) are left to dynamo as
they are (it skips them: amem's dispatch mode is on the stack).

A compiled module with graph breaks runs its `forward` under dynamo, not its `__call__`: dynamo
would otherwise trace the session's global module hooks into the region. Hooks the program put on
that module itself (not on its submodules) run eager around that forward (module_hooks.py), as
torch runs FSDP2's; its submodules' run as dynamo runs them.
"""
from __future__ import annotations

import contextlib
import sys

import torch

from ...code_files import _AMEM_DIR
from ...patching import PatchSet, declare
from . import compile_inputs, compile_sdpa, compile_trace, module_hooks
from .compile_trace import amem_suspended

MODE_STACK_GUARD = declare("torch._dynamo.guards.GuardBuilder", "TORCH_FUNCTION_STATE",
                           "while dynamo runs a region with graph breaks: no guard on the torch-function mode stack "
                           "(amem's modes are on it when the region runs, not while dynamo traces it)")
GUARDS_BUILT = declare("torch._dynamo.guards.CheckFunctionManager", "__init__",
                       "while dynamo runs a region with graph breaks: its guards are built with the Python dispatch "
                       "keys amem's modes set in thread-local state when the region runs")


class _Conversion:
    """dynamo's callback for each frame it may convert: the region's own frames (and the resume
    functions dynamo makes after each break) are converted with amem's modes suspended."""

    def __init__(self, inner, region):
        self._torchdynamo_orig_backend = inner
        self.inner, self.region = inner, region

    def __call__(self, frame, cache_entry, frame_state):
        if compile_trace.amems_code(frame):
            return compile_trace.as_eager()
        if _inside_amem(sys._getframe(1)):
            return self.inner(frame, cache_entry, frame_state)   # skipped: amem's dispatch mode is on
        with amem_suspended(), _converting(self.region.session, self.region.options), \
                compile_trace.quiet_guard_errors():
            try:
                return self.inner(frame, cache_entry, frame_state)
            except Exception as e:   # dynamo could not convert this frame here: it runs as eager
                why = compile_trace.describe_failure(e)
                self.region.note_fallback(f"a frame dynamo could not convert here ({why})")
                return compile_trace.as_eager()


def _inside_amem(frame) -> bool:
    """Whether the frame about to run is called by amem's code (its modes and hooks, between
    graphs) rather than by the region's (whose callers reach GraphBreaks.__call__ first)."""
    while frame is not None and frame.f_code is not GraphBreaks.__call__.__code__:
        if frame.f_code.co_filename.startswith(_AMEM_DIR):
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def _converting(session, options):
    from torch._dynamo.guards import CheckFunctionManager, GuardBuilder

    build = CheckFunctionManager.__init__

    def with_runtime_keys(self, *args, **kwargs):
        keys = torch._C.DispatchKey
        with torch._C._IncludeDispatchKeyGuard(keys.Python), \
                torch._C._IncludeDispatchKeyGuard(keys.PythonTLSSnapshot):
            return build(self, *args, **kwargs)

    import torch._inductor.config

    with PatchSet() as patches, compile_inputs.guarded_trace(session), \
            torch._functorch.config.patch(force_non_lazy_backward_lowering=True, enable_autograd_cache=False), \
            torch._inductor.config.patch(compile_threads=1, **compile_trace._without_benchmarks(options)):
        compile_trace._trace_patches(patches, compile_trace.props_of(session))
        patches.apply(MODE_STACK_GUARD, GuardBuilder, "TORCH_FUNCTION_STATE", lambda self, guard: None)
        patches.apply(GUARDS_BUILT, CheckFunctionManager, "__init__", with_runtime_keys)
        try:
            yield
        finally:
            compile_trace._handlers().cache_clear()   # built from the functions as patched here
            compile_trace._card_caches_clear()


def _why_split() -> str:
    """Why dynamo made several graphs of the region: its DDP optimizer, inside a DDP module's
    forward, splits the graph at DDP's gradient buckets (torch/_dynamo/backends/distributed.py),
    with nothing between them; otherwise graph breaks, with the code between them run eager."""
    from torch._dynamo.utils import get_optimize_ddp_mode
    from torch.nn.parallel import DistributedDataParallel

    if get_optimize_ddp_mode() == "ddp_optimizer" and DistributedDataParallel._get_active_ddp_module() is not None:
        return "dynamo's DDP optimizer splits it at DDP's gradient buckets, as on the GPU"
    return "eager between them (graph breaks)"


def _fakify_first_call() -> bool:
    """Whether dynamo's DDP optimizer compiles this graph: it runs each split graph once on
    dynamo's fakes to make the next one's inputs, and AOTAutograd's first call then returns only
    the outputs' fakes, with inductor's strides (runtime_wrappers.FakifiedOutWrapper)."""
    return bool(getattr(torch._guards.TracingContext.try_get(), "fakify_first_call", False))


class _FirstCallFakes:
    """A split graph's replay for the DDP optimizer: its first call (dynamo's, on its fakes, while
    it compiles the next graph) returns the outputs' fakes, as AOTAutograd's first call does
    there; every later call (the region's run, on the session's tensors) is the replay."""

    def __init__(self, fakes, replay):
        self.fakes, self.replay = fakes, replay

    def __call__(self, *args):
        if self.fakes is not None:
            fakes, self.fakes = self.fakes, None
            return fakes
        return self.replay(*args)


class GraphBreaks:
    """A region dynamo splits into several graphs: run by dynamo, each graph replayed as compiled."""

    def __init__(self, region, n_graphs: int | None, stopped: str = "", why: str = ""):
        self.region, self.statuses = region, []
        self.record: dict = {}   # the region's entry in session.compile_regions for this trace (compiled.py)
        self.n_graphs, self.calls = n_graphs, 0
        self.status = (f"predicted as compiled (inductor) in {n_graphs} graphs; {_why_split()}" if n_graphs else
                       f"predicted as compiled (inductor) graph by graph as dynamo runs it; {why}" if why else
                       "predicted as compiled (inductor) graph by graph as dynamo runs it; eager between them "
                       f"(graph breaks: the trace on torch's fakes stopped after a graph, {stopped})")
        ctx = torch._dynamo.optimize(self._backend, dynamic=False)
        ctx.callback = _Conversion(ctx.callback, region)
        region.session.patches.callback(torch._dynamo.reset)   # its code and guards (which hold the
        fn = region.fn                                          # session's objects) end with the session
        self.run = ctx(fn.forward if isinstance(fn, torch.nn.Module) else fn)   # (see the note: hooks)

    def _backend(self, gm, example_inputs):
        """One graph dynamo captured: traced as compiled.py traces a region (AOTAutograd's partition),
        and replayed on the session's tensors dynamo passes it."""
        import torch._inductor.compile_fx as cfx

        trace = compile_trace.Trace(dynamo_graphs=1)
        mode = torch._guards.TracingContext.get().fake_mode   # AOTAutograd's, as it fakes the inputs
        fakes = [mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in example_inputs]
        trace.placeholders = fakes
        props = compile_trace.props_of(self.region.session)
        gm = compile_sdpa.on_card(gm, props)   # as compile_trace's backend
        run = cfx.compile_fx(gm, example_inputs, inner_compile=compile_trace._inner(trace, True, props),
                             config_patches=compile_trace.inductor_options(self.region.options))
        fakified = _fakify_first_call()
        with mode:   # the graph's factories make fakes too
            trace.result = run(*fakes)
            if fakified:   # that call only gave the outputs' fakes; this one runs the graph
                trace.result = run(*fakes)
        plan = self.region.plan_graph(trace, fakes, self.record)
        self.statuses.append(plan if isinstance(plan, str) else plan.status)
        if isinstance(plan, str):   # this graph's ops run as eager, on the session's tensors
            self.region.note_fallback(f"one of its {len(self.statuses)}+ graphs {plan}")
            return gm.forward
        replay = lambda *args: self.region._run(plan, list(args))
        return _FirstCallFakes(trace.result, replay) if fakified else replay

    def __call__(self, *args, **kwargs):
        fn = self.region.fn
        if isinstance(fn, torch.nn.Module) and module_hooks.own(fn):   # eager around its forward (module_hooks.py)
            with module_hooks.forward_as(fn, self.run):
                out = fn._call_impl(*args, **kwargs)
        else:
            out = self.run(*args, **kwargs)   # (torch's warning of global module hooks: torch_patches.HOOKS_WARNING)
        self.calls += 1
        if self.calls == 1:
            self._note_graphs_not_compiled()
        return out

    def _note_graphs_not_compiled(self) -> None:
        """After the first call: graphs torch's own trace found that dynamo did not hand the backend
        when it ran the region here ran their ops as eager, which the output says (never silent)."""
        if not self.statuses:   # nothing of it compiled: said as the region's fallback
            self.region.note_fallback("dynamo handed amem no graph of it when it ran it here (every frame it met "
                                      "was skipped or broken up: its code ran as eager, as dynamo ran it)")
            self.record["status"] = "runs as eager: dynamo compiled no graph of it"
            return
        missing = (self.n_graphs or 0) - len(self.statuses)
        if missing > 0:
            self.region.note_fallback(f"{missing} of its {self.n_graphs} graphs not compiled when dynamo ran it "
                                      "here (their code ran as eager)")
            self.record["status"] = self.record.get("status", self.status) + \
                f"; {missing} of the {self.n_graphs} graphs ran as eager"
