"""Tracer: `with amem_alloc.Tracer(model) as t:` around forward, backward and the optimizer step.

The mechanism, a mix chosen for its cost (see docs/provenance.md):
    dispatch mode   every aten op: new storages become AllocRecords (op, module, phase, block)
    module hooks    the module path, autocast, and the model's inputs
    saved-tensor    torch's default saved_tensors_hooks: every tensor autograd saves, held as is;
    hooks + graph   each new autograd node names its slots at the op after the one that made it
    optimizer and   the optimizer phase, optimizer state, and which storages became .grad
    grad hooks
Nothing is copied or kept alive that the program would not keep: outputs are held weakly, and a
saved tensor is held exactly as long as autograd holds it.

A step is the graph built between two backwards: activations(step) reports one of them, as it
was when its backward began (the moment the graph is complete and nothing is freed yet).
"""
from __future__ import annotations

import functools
import json
import threading
import weakref

import torch
from torch.optim import optimizer as optim_hooks

from .. import atomic_write
from ..provenance_format import FORMAT
from ..user_input import output_file
from . import activations as activations_mod
from . import lookup, report
from .accounting import exact_blocks_on, storage_of
from .allocations import AllocationTable
from .classify import Knowledge, category
from .dispatch import OpContext, OpContextMode
from .graph import GraphCapture
from .records import next_seq, now_ns
from .scope import ModuleScope, _task_id, current_backward_node

_active = threading.local()


def _top_hooks_reader():
    """A function returning the innermost saved_tensors_hooks (pack, unpack) or None; None where
    torch cannot tell (torch < 2.8 has no _top_saved_tensors_default_hooks)."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    if top is None:
        return None
    try:
        top(False)
        return functools.partial(top, False)  # (ignore_is_tracing)
    except TypeError:  # an older signature without the argument
        return top


_top_hooks = _top_hooks_reader()


def _hooks_owner(top) -> str:
    """A short name for whoever's saved_tensors_hooks are innermost."""
    fn = top[0] if top is not None else None
    where = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', '')}"
    if "checkpoint" in where:
        return "checkpoint"
    return "save_on_cpu" if "save_on_cpu" in where else (where.strip(".") or "saved_tensors_hooks")


def _next_node_seq() -> int:
    """The autograd sequence number the next node made on this thread will get (or above)."""
    try:
        with torch.enable_grad():
            fn = (torch.zeros((), requires_grad=True) * 1).grad_fn
        return fn._sequence_nr() + 1 if fn is not None else 0
    except RuntimeError:  # inference_mode: no graph will be built anyway
        return 0


class Tracer:
    """Records where every storage made inside it came from, and what autograd saved.

    model: the nn.Module whose module paths, parameters and inputs to know (None: no paths).
    stacks: also record the Python stack of every allocation (costs more).
    history: how many freed allocations to keep (the oldest are dropped first).
    """

    def __init__(self, model=None, *, stacks: bool = False, history: int = 200_000):
        if model is not None and not isinstance(model, torch.nn.Module):
            raise TypeError(f"Tracer(model): model must be a torch.nn.Module or None, not {type(model).__name__}")
        self.model, self.stacks = model, bool(stacks)
        self.table = AllocationTable(history)
        self.scope = ModuleScope(model, self._on_inputs)
        self.know = Knowledge()          # what captures need while tracing
        self.graph = self._new_graph(0)
        self.pending: list = []          # (weakref to an op output, module, AllocRecord | None, ours)
        self.hooks_mode = None           # "ours", "outer" (hooks were active before), "probe" (old torch)
        self.exact_blocks = False        # amem is the CUDA allocator: read real blocks at allocation
        self._hooks_ctx = None
        self._input_refs: dict = {}      # key -> weakref to the storage of a model input
        self._optimizers = weakref.WeakSet()
        self._opt_depth, self._task = 0, -1
        self._handles: list = []
        self._mode = None
        self.state = "new"               # new -> tracing -> done
        self.started_ns = self.stopped_ns = None

    # ------------------------------------------------------------ context manager --------------
    def __enter__(self) -> "Tracer":
        if self.state != "new":
            raise RuntimeError("a Tracer records one scope: make a new Tracer for another `with` block")
        if getattr(_active, "tracer", None) is not None:
            raise RuntimeError("a Tracer is already recording in this thread; Tracers do not nest")
        self.started_ns, self.state = now_ns(), "tracing"
        self.exact_blocks = exact_blocks_on("cuda")
        self.know.model_state = self.scope.model_state()
        self.graph = self._new_graph(_next_node_seq())
        self.scope.install()
        self._install_hooks()
        self._push_saved_tensor_hooks()
        self._mode = OpContextMode(self)
        self._mode.__enter__()
        _active.tracer = self
        lookup.register(self)
        return self

    def __exit__(self, *exc) -> bool:
        try:
            self._mode.__exit__(*exc)
        finally:
            if self._hooks_ctx is not None:
                self._hooks_ctx.__exit__(*exc)
            _active.tracer = None
            self.flush()
            self.scope.remove()
            for handle in self._handles:
                handle.remove()
            self._handles.clear()
            self.state, self.stopped_ns = "done", now_ns()
        return False

    def _new_graph(self, start_seq: int) -> GraphCapture:
        return GraphCapture(start_seq, self)

    def _push_saved_tensor_hooks(self) -> None:
        """Our pack/unpack become the default hooks, unless hooks are active already (save_on_cpu
        around the tracer: ours would shadow theirs) or torch cannot say whose hooks are on top."""
        if _top_hooks is None:
            self.hooks_mode, self.graph.default_owner = "probe", "other"
        elif _top_hooks() is not None:
            self.hooks_mode, self.graph.default_owner = "outer", _hooks_owner(_top_hooks())
        else:
            self.hooks_mode = "ours"
            self._hooks_ctx = torch.autograd.graph.saved_tensors_hooks(self.graph.pack, self.graph.unpack)
            self._hooks_ctx.__enter__()

    def _install_hooks(self) -> None:
        self._handles.append(optim_hooks.register_optimizer_step_pre_hook(self._optimizer_pre))
        self._handles.append(optim_hooks.register_optimizer_step_post_hook(self._optimizer_post))
        if hasattr(torch.Tensor, "register_post_accumulate_grad_hook"):  # torch >= 2.1
            for p in self.scope.parameters():
                if p.requires_grad:
                    self._handles.append(p.register_post_accumulate_grad_hook(self._on_grad))

    # ------------------------------------------------------------ called per op ----------------
    def before_op(self):
        """The OpContext of the op about to run; first hands queued outputs to the graph capture."""
        task = _task_id()
        if task != -1:
            return self._backward_op(task)
        if self.pending:
            self.flush()
        if self._opt_depth:
            return OpContext("optimizer", None)
        stack = self.scope.stack
        ctx = OpContext("forward", stack[-1]) if stack else OpContext("other", None)
        if self.hooks_mode == "ours":
            top = _top_hooks()
            ctx.ours = True if top is not None and top[0] is self.graph.pack else _hooks_owner(top)
        else:  # our hooks are not installed: any hooks on a slot are someone else's
            ctx.ours = self.graph.default_owner
        return ctx

    def _backward_op(self, task: int) -> OpContext:
        if task != self._task:  # a backward begins: the graph is complete, nothing freed yet
            self._task = task
            self.flush()
            self.know.backward_starts.append(next_seq())
            self.graph.close_step()
        ctx = OpContext("backward", self.scope.module)
        ctx.recompute = bool(self.scope.stack)  # a module forward inside backward: checkpoint
        node = current_backward_node()
        if node is not None:
            rec = self.graph.nodes.get(node._sequence_nr())
            ctx.grad_node, ctx.grad_node_module = node.name(), (rec.module if rec is not None else None)
            if not ctx.recompute:
                ctx.module = ctx.grad_node_module  # gradients belong to the module whose backward made them
        return ctx

    def flush(self) -> None:
        """Hands queued op outputs (which now carry their grad_fn) to the graph capture."""
        items, self.pending = self.pending, []
        for ref, module, rec, ours in items:
            tensor = ref()
            fn = tensor.grad_fn if tensor is not None else None
            if fn is None:
                continue
            if rec is not None:
                rec.in_graph = True
                if rec.phase == "other":
                    rec.phase = "forward"  # it joined the autograd graph: forward work outside the model
            self.graph.discover(fn, module, ours)

    # ------------------------------------------------------------ hooks ------------------------
    def _mark(self, tensor, role: str):
        facts = storage_of(tensor) if tensor is not None else None
        if facts is None:
            return None
        rec = self.table.find(facts[1], facts[0])
        if rec is not None:
            rec.add_role(role)
        return facts

    def _on_inputs(self, tensors) -> None:
        for t in tensors:
            facts = self._mark(t, "input")
            if facts is not None and facts[1][1]:
                self._input_refs[facts[1]] = weakref.ref(facts[0])

    def is_input(self, key, storage) -> bool:
        """Whether this very storage was passed to the model (not just one at the same address)."""
        ref = self._input_refs.get(key)
        return ref is not None and ref() is storage

    def _on_grad(self, param) -> None:
        self._mark(param.grad, "gradient")

    def _optimizer_pre(self, optimizer, args, kwargs) -> None:
        self._opt_depth += 1
        self._optimizers.add(optimizer)
        for group in optimizer.param_groups:
            for p in group["params"]:
                self._mark(p.grad, "gradient")

    def _optimizer_post(self, optimizer, args, kwargs) -> None:
        self._opt_depth = max(0, self._opt_depth - 1)
        for t in _state_tensors(optimizer):
            self._mark(t, "optimizer_state")

    # ------------------------------------------------------------ queries ----------------------
    def knowledge(self) -> Knowledge:
        """What is known now: current parameters, live inputs, current grads and optimizer state."""
        know = Knowledge()
        know.model_state = self.scope.model_state()
        know.inputs = {k for k, ref in self._input_refs.items() if ref() is not None}
        names = self._param_names()
        for p, name in names.items():
            facts = storage_of(p.grad) if p.grad is not None else None
            if facts is not None:
                know.grads[facts[1]] = name
        for opt in list(self._optimizers):
            for p, state in list(opt.state.items()):
                for field, value in state.items():
                    facts = storage_of(value) if isinstance(value, torch.Tensor) else None
                    if facts is not None:
                        know.optimizer_state[facts[1]] = f"{field} of {names.get(p, 'a parameter')}"
        know.backward_starts = list(self.know.backward_starts)
        return know

    def _param_names(self) -> dict:
        """{parameter: name} for the model's parameters and those of the optimizers seen."""
        names = {}
        for opt in list(self._optimizers):
            for group in opt.param_groups:
                names.update((p, "an optimizer parameter") for p in group["params"])
        if self.model is not None:
            names.update((p, f"parameter {n}") for n, p in self.model.named_parameters())
        return names

    def _steps(self) -> list:
        """[(nodes, saved slots)] of each step that made nodes or saved tensors."""
        self._flush_if_done()
        return [(n, s) for n, s in zip(self.graph.steps, self.graph.saved) if n or s]

    @property
    def steps(self) -> int:
        """How many forward/backward steps built a graph inside the tracer."""
        return len(self._steps())

    def activations(self, step: int | None = None) -> "activations_mod.ActivationReport":
        """Activation memory per autograd node and per module for one step (1-based; None = the
        latest step that built a graph)."""
        return activations_mod.build(self._steps(), step, self.model, self.hooks_mode)

    def provenance(self, tensor) -> "lookup.Provenance":
        """Where a tensor's storage came from, as this tracer saw it."""
        self._flush_if_done()
        return lookup.provenance(tensor, tracer=self)

    def allocations(self, live_only: bool = False) -> list[dict]:
        """Every storage made inside the tracer (the freed ones as far as `history` reaches)."""
        know = self.knowledge()
        return [report.alloc_row(rec, category(rec.key, rec, know)) for rec in self.table.records(live_only)]

    def summary(self) -> dict:
        return report.summary(self.allocations(), self.table)

    def to_dict(self, allocations: bool = True) -> dict:
        steps = self._steps()
        acts = [activations_mod.build(steps, i + 1, self.model, self.hooks_mode).to_dict() for i in range(len(steps))]
        data = {
            "format": FORMAT,
            "torch": torch.__version__,
            "model": type(self.model).__name__ if self.model is not None else None,
            "duration_ms": report.duration_ms(self.started_ns, self.stopped_ns),
            "headline": report.headline(acts),
            "largest_saved": report.largest_saved(acts[-1] if acts else None),
            "summary": self.summary(),
            "activations": acts,
        }
        if allocations:
            data["allocations"] = self.allocations()
        return data

    def to_json(self, path=None, indent: int | None = None, allocations: bool = True) -> str:
        if path is not None:  # a path that cannot be written is said before the work, in one line
            output_file(path, "Tracer.to_json")
        text = json.dumps(self.to_dict(allocations=allocations), indent=indent)
        if path is not None:
            atomic_write.write_text(path, text)
        return text

    def report(self, file=None, compare=None, top: int = 25, labels=None) -> str:
        """A readable account, returned (a REPL or notebook shows it once, as text) and written to
        `file` if one is given (print(t.report()) in a script); with compare=another Tracer or
        ActivationReport, the activation figures of both side by side."""
        text = report.ReportText(report.tracer_text(self, compare=compare, top=top, labels=labels))
        if file is not None:
            print(text, file=file)
        return text

    def _flush_if_done(self) -> None:
        if self.pending:  # outputs of the last op before this question
            self.flush()


def _state_tensors(optimizer):
    for state in list(optimizer.state.values()):
        for value in state.values():
            if isinstance(value, torch.Tensor):
                yield value
