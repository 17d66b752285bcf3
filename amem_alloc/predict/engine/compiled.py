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

A region that torch would not compile to one graph (a graph break), or that cannot be traced here,
runs as eager, and the output names the region and why (never silently).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from .. import notes as notes_mod
from . import compile_trace
from .compile_trace import amem_suspended

COMPILED = "predicted as compiled (inductor)"
PARTITION_ONLY = ("predicted as compiled (inductor): AOTAutograd's partition as torch makes it; "
                  "inside each graph, buffers op by op (inductor's fusion and reuse not modelled)")
OP_BY_OP = "predicted as compiled (inductor's partition; its buffers op by op: {why})"


def _describe(e: BaseException) -> str:
    e = getattr(e, "inner_exception", None) or e   # dynamo's BackendCompilerFailed: the backend's error
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:160]}" if text else type(e).__name__


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
    leaves: list            # per leaf: ("out", k), ("in", i) or ("value", v)
    status: str             # COMPILED or OP_BY_OP's text
    saved_bytes: int = 0    # the forward's saved-for-backward tensors not among its inputs


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
        if plan is None:
            plan = self.plans[key] = self._trace(tensors, params, args, kwargs)
        if isinstance(plan, str):   # the reason it runs eager
            return self.session.compiled(self.fn, inductor=True)(*args, **kwargs)
        return self._run(plan, tensors)

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
        except Exception as e:   # torch could not trace it here: eager, and said so
            plan = f"runs as eager: {_describe(e)}"
        status = plan if isinstance(plan, str) else plan.status
        self.session.compile_regions.append({"region": self.name, "where": where, "status": status,
                                             "saved_bytes": getattr(plan, "saved_bytes", 0)})
        kind = notes_mod.NOT_MODELLED if isinstance(plan, str) else notes_mod.COMPILED
        notes_mod.record(kind, f"torch.compile region {self.name}: {status}")
        return plan

    def _plan(self, tensors, params, args, kwargs) -> Plan | str:
        from torch._subclasses import FakeTensorMode

        with amem_suspended():
            torch._C._ensureCUDADeviceGuardSet()   # as FakeTensor does where torch.cuda has no device
            mode = FakeTensorMode()                # (the shims answer that it has one)
            with mode:
                fakes = [_fake_like(t) for t in tensors]
            by_id = {id(t): f for t, f in zip(tensors, fakes)}
            fake_args, fake_kwargs = _swap_leaves((args, kwargs), by_id)
            with mode, _swapped(params, fakes[len(fakes) - len(params):]):
                trace = compile_trace.run_traced(self.fn, fake_args, fake_kwargs,
                                                 compile_trace.props_of(self.session), self.options)
        return _plan_of(trace, fakes)

    # ------------------------------------------------------------------ run
    def _run(self, plan: Plan, tensors):
        inputs = [tensors[i] for i in plan.inputs]
        runner = self.session.graph_runner
        if plan.backward is not None and torch.is_grad_enabled():
            outs = _Region.apply(plan, runner, *inputs)
        else:
            with torch.no_grad():
                outs = runner.run(plan.forward, inputs)[:plan.n_user]
        leaves = [outs[v] if kind == "out" else tensors[v] if kind == "in" else v for kind, v in plan.leaves]
        return tree_unflatten(leaves, plan.spec)


def _fake_like(t: torch.Tensor) -> torch.Tensor:
    out = torch.empty_strided(tuple(t.shape), t.stride(), dtype=t.dtype, device="cuda")
    out.requires_grad_(t.requires_grad)
    if isinstance(t, torch.nn.Parameter):   # as nn.Parameter makes one of a tensor subclass (its
        out._is_param = True                # __new__ is the session's, which would make it meta)
    return out


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


def _plan_of(trace, fakes: list) -> Plan | str:
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
    out_ids = {id(t): k for k, t in enumerate(trace.forward_outputs[:n_user])}
    leaves, spec = tree_flatten(trace.result)
    where = []
    for x in leaves:
        if isinstance(x, torch.Tensor) and id(x) in out_ids:
            where.append(("out", out_ids[id(x)]))
        elif isinstance(x, torch.Tensor) and id(x) in index:
            where.append(("in", index[id(x)]))
        elif isinstance(x, torch.Tensor):
            return "runs as eager: its result is not the graph's outputs (aliases or mutations)"
        else:
            where.append(("value", x))
    tangents = [k for k, t in enumerate(trace.forward_outputs[:n_user]) if t.requires_grad]
    saved_bytes = _saved_bytes(fw[0].gm, n_user)
    errors = [g.wrapper_error for g in trace.graphs if g.wrapper_error]
    replayed = all(g.wrapper is not None and getattr(g, "replay", None) is not None for g in trace.graphs)
    status = OP_BY_OP.format(why=errors[0]) if errors else COMPILED if replayed else PARTITION_ONLY
    return Plan([inputs[i] for i in range(len(inputs))], fw[0], bw[0] if bw else None, n_user, tangents,
                spec, where, status, saved_bytes)


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


class CompiledModule(torch.nn.Module):
    """What torch.compile(module) returns under prediction, as torch's OptimizedModule: the module
    kept as `_orig_mod` (state_dict keys gain its prefix, as torch's do), calls going through its
    compiled region, every other attribute read from the module."""

    def __init__(self, mod: torch.nn.Module, region: CompiledRegion):
        super().__init__()
        self._orig_mod = mod
        self.__dict__["_region"] = region

    def forward(self, *args, **kwargs):
        return self.__dict__["_region"](*args, **kwargs)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["_orig_mod"], name)
