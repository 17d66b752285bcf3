"""A region given to torch.compile, predicted as compiled: torch decides the graphs on its own fake
CUDA tensors (compile_trace.py), and the prediction replays what they allocate on the session's
fake tensors, inside the same recorded run.

Per call, a region's inputs (the call's tensors, and a module's parameters and buffers) are keyed
by shape, stride, dtype and requires_grad, with grad mode and autocast: a new key is traced again,
as dynamo recompiles on new shapes. The replay is an autograd Function, as AOTAutograd's
`CompiledFunction` is: forward runs the forward graph and keeps what it saves for backward (its
outputs after the user's), backward runs the backward graph on those and the incoming gradients.
Each graph runs as inductor's wrapper runs it (inductor_replay.py: fused kernels allocate only their
outputs, buffers are reused and deleted as its plan says); where the wrapper could not be
generated, the partitioned graph runs op by op, and the output says so.

A region that dynamo splits into several graphs (a graph break) is run by dynamo itself, its graphs
replayed as compiled and eager between them (graph_breaks.py). A region that cannot be traced here,
or must not be (compile_inputs.py), runs as eager, and the output names the region and why (never
silently).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from .. import notes as notes_mod
from . import compile_inputs, compile_trace, compiled_optimizer, cudagraph_pool, module_hooks
from .compile_trace import amem_suspended
from .devices import cuda_index
from .graph_breaks import GraphBreaks

COMPILED = "predicted as compiled (inductor)"
FSDP_HOOKS = "FSDP2's hooks run eager between its graphs, as on the GPU (dynamo never traces them)"
FSDP1_EAGER = ("runs as eager: a FullyShardedDataParallel (FSDP1) region is not traced (its lazy initialisation "
               "and hooks would run on torch's fake tensors and change FSDP's own state); torch compiles the "
               "modules between its hooks, which may save less for backward than eager does")
FORWARD_SKIPPED = ("runs as eager, as torch runs it: its hooks break the graph and dynamo skips {forward}, "
                   "torch's own module code, as a frame of its own")
PARTITION_ONLY = ("predicted as compiled (inductor): AOTAutograd's partition as torch makes it; "
                  "inside each graph, buffers op by op (inductor's fusion and reuse not modelled)")
OP_BY_OP = "predicted as compiled (inductor's partition; its buffers op by op: {why})"


@dataclass
class Plan:
    """What one trace decided: graph inputs (indices into the region's tensors), the graphs, and
    how the region's result is rebuilt from the forward's outputs."""
    inputs: list            # per graph input: index into the region's tensors
    forward: Any            # compile_trace.Graph
    backward: Any           # compile_trace.Graph or None (inference)
    n_user: int             # forward outputs the user gets (the rest are saved for backward)
    tangent_outputs: list   # user outputs (by index) whose gradient the backward graph takes
    spec: Any               # the result's tree structure
    leaves: list            # per leaf: ("out", k), ("in", i), ("passed", j), ("value", v) or ("view", View)
    status: str             # COMPILED or OP_BY_OP's text
    saved_bytes: int = 0    # the forward's saved-for-backward tensors not among its inputs
    lifted: list = field(default_factory=list)   # compile_inputs.Read per tensor read from outside (globals...)


class _Region(torch.autograd.Function):
    """AOTAutograd's CompiledFunction, replayed: forward saves what the partition saves."""

    @staticmethod
    def forward(ctx, plan, runner, *inputs):
        outs = runner.run(plan.forward, list(inputs))
        ctx.plan, ctx.runner = plan, runner
        ctx.save_for_backward(*outs[plan.n_user:])
        for i, out in enumerate(outs[:plan.n_user]):
            if i not in plan.tangent_outputs:
                ctx.mark_non_differentiable(out)
        return tuple(outs[:plan.n_user])

    @staticmethod
    def backward(ctx, *grads):
        plan = ctx.plan
        args = [*ctx.saved_tensors, *(grads[i] for i in plan.tangent_outputs)]   # (zeros where none came)
        ctx.maybe_clear_saved_tensors()   # as AOTAutograd's backward: the graph frees what was saved
        outs = ctx.runner.run(plan.backward, args)   # as it goes (`args` is cleared by the graph's call)
        return (None, None, *outs[:len(plan.inputs)])


class CompiledRegion:
    """`fn` (a function, or a module's call) as torch.compile(fn) would run it (see the module's note)."""

    def __init__(self, session, fn, module=None, options: dict | None = None, where: str = ""):
        self.session, self.fn, self.module = session, fn, module
        self.options = options
        self.name = getattr(module, "__class__", type(fn)).__name__ if module is not None else getattr(fn, "__qualname__", "fn")
        self.plans: dict = {}

    def __call__(self, *args, **kwargs):
        tensors, params = self._tensors(args, kwargs)
        key = self._key(tensors)
        plan = self.plans.get(key)
        read = _reads_now(plan, self.fn, args, kwargs)
        if plan is None or read is None:   # new inputs, or what it reads from outside changed
            plan = self.plans[key] = self._trace(tensors, params, args, kwargs)
            read = _reads_now(plan, self.fn, args, kwargs)
        if isinstance(plan, str):   # the reason it runs eager (an optimizer's step as inductor's)
            with compiled_optimizer.as_compiled_steps():
                return self.session.compiled(self.fn, inductor=True)(*args, **kwargs)
        if isinstance(plan, GraphBreaks):
            return plan(*args, **kwargs)
        return self._run(plan, tensors + read, _objects(args, kwargs))

    # ------------------------------------------------------------------ inputs
    def _tensors(self, args, kwargs) -> tuple[list, list]:
        """The call's tensors, then the module's parameters and buffers ((owner, kind, name) each)."""
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        params = []
        if self.module is not None:
            for mod in self.module.modules():
                for kind in ("_parameters", "_buffers"):
                    for name, t in getattr(mod, kind).items():
                        if t is not None:
                            params.append((mod, kind, name))
                            tensors.append(t)
        return tensors, params

    def _key(self, tensors) -> tuple:
        with amem_suspended():
            shapes = tuple((tuple(t.shape), t.stride(), t.dtype, t.requires_grad) for t in tensors)
        training = tuple(m.training for m in self.module.modules()) if self.module is not None else ()
        return (shapes, training, torch.is_grad_enabled(), torch.is_autocast_enabled("cuda"),
                torch.get_autocast_dtype("cuda"))

    # ------------------------------------------------------------------ trace
    def _trace(self, tensors, params, args, kwargs):
        where = notes_mod.call_site(3)
        try:
            plan = self._plan(tensors, params, args, kwargs)
        except Exception as e:   # torch could not trace it here, or must not: eager, and said so
            plan = f"runs as eager: {compile_inputs.refusal(e) or compile_trace.describe_failure(e)}"
        status = plan if isinstance(plan, str) else plan.status + _mode_notes(self.options)
        record = region_record(self.session, self.name, where, status, getattr(plan, "saved_bytes", 0),
                               compiled=not isinstance(plan, str), again=bool(self.plans))
        if isinstance(plan, Plan):
            record["graphs"].append(_graph_record(plan))
        if isinstance(plan, GraphBreaks):   # its graphs are planned as dynamo runs them, into this record
            plan.record = record
        return plan

    def plan_graph(self, trace, fakes: list, record: dict):
        """The plan of one graph of several (graph_breaks.py), made as a whole region's is; the
        region's record of that trace (the JSON's compiled_regions) gains the graph's figures."""
        plan = _plan_of(trace, fakes)
        graph = _graph_record(plan) if isinstance(plan, Plan) else {"status": plan, "saved_bytes": 0}
        record.setdefault("graphs", []).append(graph)
        record["saved_bytes"] = record.get("saved_bytes", 0) + graph["saved_bytes"]
        return plan

    def note_fallback(self, why: str) -> None:
        """A part of the region runs as eager (one graph of several): said, never silent."""
        notes_mod.record(notes_mod.NOT_MODELLED, f"torch.compile region {self.name}: {why}; it runs as eager")

    def _plan(self, tensors, params, args, kwargs) -> Plan | str:
        from torch._subclasses import FakeTensorMode

        optimizer = _stepped_optimizer(self.fn, args)
        if optimizer is not None:   # refused before the trace: dynamo would store its state at a graph break
            hooks_outside = getattr(self.fn, "__self__", None) is not optimizer   # a method compiled in its class
            if hooks_outside and type(optimizer).__name__ not in compiled_optimizer.FUSABLE:
                notes_mod.record(notes_mod.ESTIMATE, compiled_optimizer.UNFUSED_NOTE.format(name=type(optimizer).__name__))
            raise compile_inputs.RefusedRegion(compile_inputs.OPTIMIZER_REASON)
        if module_hooks.fsdp1_inside(self.module):
            return FSDP1_EAGER
        if module_hooks.fsdp_inside(self.module, self.fn):   # not on torch's fakes first (module_hooks.py)
            if isinstance(self.fn, torch.nn.Module) and module_hooks.torch_compiles_nothing(self.fn):
                return FORWARD_SKIPPED.format(forward=type(self.fn).forward.__qualname__)
            return GraphBreaks(self, None, why=FSDP_HOOKS)
        with amem_suspended():
            torch._C._ensureCUDADeviceGuardSet()   # as FakeTensor does where torch.cuda has no device
            mode = FakeTensorMode()   # (the shims answer that it has one)
            with mode:
                fakes = [_fake_like(t) for t in tensors]
            by_id = {id(t): f for t, f in zip(tensors, fakes)}
            fake_args, fake_kwargs = _swap_leaves((args, kwargs), by_id)
            with mode, _swapped(params, fakes[len(fakes) - len(params):]), \
                    compile_inputs.guarded_trace(self.session, mode) as seen:
                try:
                    trace = compile_trace.run_traced(self.fn, fake_args, fake_kwargs,
                                                     compile_trace.props_of(self.session), self.options)
                except Exception as e:   # after a graph: the eager code between graphs failed on fakes
                    if not seen.graphs or compile_inputs.refusal(e) is not None:   # (an .item() on one)
                        raise
                    return GraphBreaks(self, None, compile_trace.describe_failure(e))
        if trace.dynamo_graphs > 1:   # dynamo runs it: its graphs compiled, eager between them
            return GraphBreaks(self, trace.dynamo_graphs)
        read = _read_from_outside(trace, fakes)
        plan = _plan_of(trace, fakes + read, _objects(args, kwargs))
        if isinstance(plan, Plan) and not all(_plain(v) for kind, v in plan.leaves if kind == "value"):
            return "runs as eager: its result holds objects the trace made (they would hold its fake tensors)"
        if isinstance(plan, Plan):
            plan.lifted = [compile_inputs.Read(t, seen.sources.get(id(t))) for t in read]
        return plan

    # ------------------------------------------------------------------ run
    def _run(self, plan: Plan, tensors, objects: list = ()):
        inputs = [tensors[i] for i in plan.inputs]
        runner = self.session.graph_runner
        if cudagraph_pool.wants_cudagraphs(self.options):
            runner = cudagraph_pool.PooledRunner(self.session, runner)
        if plan.backward is not None and torch.is_grad_enabled():
            outs = _Region.apply(plan, runner, *inputs)
        else:
            with torch.no_grad():
                outs = runner.run(plan.forward, inputs)[:plan.n_user]
        leaves = [_leaf(kind, v, outs, tensors, objects) for kind, v in plan.leaves]
        return tree_unflatten(leaves, plan.spec)


@dataclass(frozen=True)
class View:
    """A result leaf that AOTAutograd's runtime regenerates as a view of a graph output or input
    (an output aliasing an intermediate, e.g. a KV cache's keys as views of the fused QKV
    projection): the same size and strides, at the same offset from its base's."""
    source: str       # "out" (a forward output) or "in" (a region's tensor)
    index: int
    size: tuple
    stride: tuple
    offset: int       # storage offset relative to the base's

    def of(self, base: torch.Tensor) -> torch.Tensor:
        return base.as_strided(self.size, self.stride, base.storage_offset() + self.offset)


def _leaf(kind, v, outs, tensors, objects):
    if kind == "out":
        return outs[v]
    if kind == "in":
        return tensors[v]
    if kind == "passed":
        return objects[v]
    if kind == "view":
        return v.of(outs[v.index] if v.source == "out" else tensors[v.index])
    return v


TRACED_AGAIN = " (a later call, traced again as dynamo recompiles: new input shapes, modes or tensors read from outside)"


def region_record(session, name: str, where: str, status: str, saved_bytes: int = 0, compiled: bool = False,
                  again: bool = False) -> dict:
    """A traced region's entry in the output (the JSON's compiled_regions), and its note: how it is
    predicted (`compiled`), or why it runs as eager; `again`: a later trace of the region (its note
    says so: one region's calls can be predicted differently, and two notes at one line must not
    read as contradicting each other)."""
    record = {"region": name, "where": where, "status": status, "saved_bytes": saved_bytes, "graphs": []}
    session.compile_regions.append(record)
    kind = notes_mod.COMPILED if compiled else notes_mod.NOT_MODELLED
    notes_mod.record(kind, f"torch.compile region {name}: {status}" + (TRACED_AGAIN if again else ""), where=where)
    return record


def _graph_record(plan: Plan) -> dict:
    """One graph's figures as the output gives them: how it is predicted, the bytes its forward
    saves for backward (torch's partition; none for an inference graph), and how many of its
    wrappers (forward, backward) an earlier prediction kept (wrapper_cache.py)."""
    kept = sum(1 for g in (plan.forward, plan.backward) if g is not None and g.kept)
    return {"status": plan.status, "saved_bytes": plan.saved_bytes, "wrappers_kept": kept}


def _mode_notes(options: dict | None) -> str:
    """What torch.compile's `mode` adds to a region's status (reduce-overhead; max-autotune's
    estimate is a note of its own, compile_trace.py)."""
    return f"; {cudagraph_pool.NOTE}" if cudagraph_pool.wants_cudagraphs(options) else ""


def _reads_now(plan, fn, args, kwargs) -> list | None:
    """The tensors a traced region reads from outside its arguments at this call ([] for none or
    for a region not replayed from a plan; None where one is gone or is not what was traced)."""
    if not isinstance(plan, Plan):
        return []
    read = [r.now(fn, args, kwargs) for r in plan.lifted]
    return None if any(t is None for t in read) else read


def _plain(value) -> bool:
    """A result leaf the replay may hand back as the trace made it (no tensors inside)."""
    return value is None or isinstance(value, (bool, int, float, complex, str, bytes, torch.dtype, torch.device,
                                               torch.Size))


def _read_from_outside(trace, fakes: list) -> list:
    """The program's tensors dynamo lifted as graph inputs from outside the region's arguments
    (globals, closures, objects: their `grapharg.example` is the value it read)."""
    from torch._subclasses.fake_tensor import FakeTensor

    ours = {id(f) for f in fakes}
    out = []
    for t in trace.placeholders:
        if isinstance(t, torch.Tensor) and not isinstance(t, FakeTensor) and id(t) not in ours:
            ours.add(id(t))
            out.append(t)
    return out


def _fake_like(t: torch.Tensor) -> torch.Tensor:
    out = torch.empty_strided(tuple(t.shape), t.stride(), dtype=t.dtype, device=torch.device("cuda", cuda_index()))
    out.requires_grad_(t.requires_grad)
    if isinstance(t, torch.nn.Parameter):   # as nn.Parameter makes one of a tensor subclass (its
        out._is_param = True                # __new__ is the session's, which would make it meta)
    return out


def _stepped_optimizer(fn, args):
    """The optimizer whose own method `fn` is (bound, or called with it as `self`: a step method
    compiled in its class, modded-nanogpt's DistAdam), or None."""
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, torch.optim.Optimizer):
        return owner
    if args and isinstance(args[0], torch.optim.Optimizer):
        cls = getattr(fn, "__qualname__", "").rpartition(".")[0]
        if cls in {c.__qualname__ for c in type(args[0]).__mro__}:
            return args[0]
    return None


def _swap_leaves(tree, by_id: dict):
    leaves, spec = tree_flatten(tree)
    return tree_unflatten([by_id.get(id(x), x) if isinstance(x, torch.Tensor) else x for x in leaves], spec)


class _swapped:
    """A module's parameters and buffers replaced by fake ones while it is traced."""

    def __init__(self, params: list, fakes: list):
        self.params, self.fakes, self.saved = params, fakes, []

    def __enter__(self):
        for (mod, kind, name), fake in zip(self.params, self.fakes):
            table = getattr(mod, kind)
            self.saved.append((table, name, table[name]))
            table[name] = fake
        return self

    def __exit__(self, *exc):
        for table, name, value in reversed(self.saved):
            table[name] = value


def _objects(args, kwargs) -> list:
    """The call's arguments that are not tensors, in order (a result may hand one back: a KV
    cache object the region updated in place)."""
    return [x for x in tree_flatten((args, kwargs))[0] if not isinstance(x, torch.Tensor)]


def _plan_of(trace, fakes: list, objects: list = ()) -> Plan | str:
    if trace.dynamo_graphs != 1:
        return (f"runs as eager: dynamo made {trace.dynamo_graphs} graphs (graph breaks)" if trace.dynamo_graphs
                else "runs as eager: nothing for inductor to compile")
    fw = [g for g in trace.graphs if not g.is_backward]
    bw = [g for g in trace.graphs if g.is_backward]
    index = {id(f): i for i, f in enumerate(fakes)}
    inputs = [index.get(id(p)) for p in trace.placeholders]
    if None in inputs:
        return "runs as eager: the region reads tensors it is not passed (globals, closures)"
    n_saved = sum(1 for n in bw[0].gm.graph.nodes if n.op == "placeholder" and not n.name.startswith("tangents")) if bw else 0
    n_user = len(trace.forward_outputs) - n_saved
    tangents = trace.tangents if trace.tangents is not None and bw else \
        [k for k, t in enumerate(trace.forward_outputs[:n_user]) if t.requires_grad]
    out_ids = {id(t): k for k, t in enumerate(trace.forward_outputs[:n_user])}
    passed = {id(x): k for k, x in enumerate(objects) if not _plain(x)}
    leaves, spec = tree_flatten(trace.result)
    where = []
    for x in leaves:
        if isinstance(x, torch.Tensor) and id(x) in out_ids:
            where.append(("out", out_ids[id(x)]))
        elif isinstance(x, torch.Tensor) and id(x) in index:
            where.append(("in", index[id(x)]))
        elif isinstance(x, torch.Tensor):
            view = _view_of(x, trace.forward_outputs[:n_user], tangents, fakes)
            if view is None:
                return "runs as eager: its result holds a tensor that is neither a graph output nor a view of one"
            where.append(("view", view))
        elif id(x) in passed:   # an argument handed back: the call's own, not the trace's
            where.append(("passed", passed[id(x)]))
        else:
            where.append(("value", x))
    saved_bytes = _saved_bytes(fw[0].gm, n_user)
    errors = [g.wrapper_error for g in trace.graphs if g.wrapper_error]
    replayed = all(g.wrapper is not None and getattr(g, "replay", None) is not None for g in trace.graphs)
    status = OP_BY_OP.format(why=errors[0]) if errors else COMPILED if replayed else PARTITION_ONLY
    return Plan([inputs[i] for i in range(len(inputs))], fw[0], bw[0] if bw else None, n_user, tangents,
                spec, where, status, saved_bytes)


def _view_of(x: torch.Tensor, outputs: list, tangents: list, inputs: list) -> View | None:
    """`x` as a view of a forward output sharing its storage, one the backward takes a gradient
    of first (the intermediate base AOTAutograd added), or else of a region's tensor. Made with
    `as_strided` (torch replays the view's own ops: the same bytes, a different backward node)."""
    storage = _storage_key(x)
    order = [*tangents, *(k for k in range(len(outputs)) if k not in tangents)]
    candidates = [("out", k, outputs[k]) for k in order] + [("in", i, t) for i, t in enumerate(inputs)]
    for source, k, base in candidates:
        if isinstance(base, torch.Tensor) and storage is not None and _storage_key(base) == storage:
            return View(source, k, tuple(x.shape), tuple(x.stride()), x.storage_offset() - base.storage_offset())
    return None


def _storage_key(t: torch.Tensor):
    try:
        return t.untyped_storage()._cdata
    except Exception:   # a tensor without storage (a subclass): no view of anything here
        return None


def _saved_bytes(gm, n_user: int) -> int:
    """Bytes of what the forward graph saves for backward that it made itself (not its inputs, nor
    views of them: a weight's transpose is saved as a view)."""
    nodes = list(gm.graph.nodes)
    inputs = {id(n.meta["val"].untyped_storage()) for n in nodes
              if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)}
    storages = {}
    for node in nodes[-1].args[0][n_user:]:
        val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if isinstance(val, torch.Tensor) and id(val.untyped_storage()) not in inputs:
            storages[id(val.untyped_storage())] = val.untyped_storage().nbytes()
    return sum(storages.values())


class _RegionContext:
    """OptimizedModule's `dynamo_ctx`, which torch applies to what it compiles: the module's own
    call becomes the module's compiled region; any other function given to it (Lightning compiles
    the module's `forward` and `training_step` with the compiled module's context) a compiled
    function of its own, as dynamo's context would compile it."""

    def __init__(self, session, mod: torch.nn.Module, options: dict | None):
        self.session, self.mod, self.options = session, mod, options
        self.region = CompiledRegion(session, mod, mod, options)

    def __call__(self, fn):
        if fn is self.mod or getattr(fn, "__wrapped__", None) is self.mod or (   # (torch's wrap_inline)
                getattr(fn, "__self__", None) is self.mod and
                getattr(fn, "__name__", "") in ("__call__", "_call_impl", "_wrapped_call_impl")):
            return _calling(self.region, fn)
        return compiled_function(self.session, fn, self.options)


def eager_module(mod: torch.nn.Module) -> torch.nn.Module:
    """torch.compile(module) run as eager (an eager backend, or a region refused): torch's
    OptimizedModule around the module, its calls the module's own."""
    from torch._dynamo.eval_frame import OptimizedModule

    return OptimizedModule(mod, lambda fn: fn)


def compiled_module(session, mod: torch.nn.Module, options: dict | None) -> torch.nn.Module:
    """What torch.compile(module) returns under prediction: torch's own OptimizedModule (libraries
    check for it: Lightning refuses any other), the module kept as `_orig_mod` (state_dict keys gain
    its prefix, attributes are the module's), its calls going through the module's compiled region."""
    from torch._dynamo.eval_frame import OptimizedModule

    return OptimizedModule(mod, _RegionContext(session, mod, options))


def compiled_function(session, fn, options: dict | None):
    """What torch.compile(fn) returns under prediction for a function (or a bound method): calls
    go through its compiled region; the tensors it reads other than its arguments are the
    session's (compile_inputs.py)."""
    owner = getattr(fn, "__self__", None)   # Module.compile compiles its bound _call_impl: keyed by
    module = owner if isinstance(owner, torch.nn.Module) else None   # its training flags, as a module's
    return _calling(CompiledRegion(session, fn, module, options), fn)


def _calling(region: CompiledRegion, fn):
    """`fn` as compiled: each call goes through `region`."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        return region(*args, **kwargs)
    run._torchdynamo_inline = fn   # called inside another region dynamo traces: `fn` is traced there, as torch does
    return run
