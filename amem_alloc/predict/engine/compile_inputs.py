"""The tensors a compiled region reads without being passed them, and what a trace must not do.

A compiled function reads tensors from its globals, its closure, or objects it reaches (a module
held in a global, a model's buffers); dynamo lifts each as an input of its graph, whose
`grapharg.example` is the value it read: here, the session's own fake tensor. While a region is
traced (amem's modes suspended) such a tensor is a plain meta tensor, which torch's fake mode
would make a meta fake and then refuse beside the region's CUDA ones; its fake claims the CUDA
device instead, and the replay reads the session tensor itself (compiled.py).

The trace runs the region on fakes and dynamo applies its side effects to the program's real
objects after the graph runs: a region whose graph would store tensors into the program's objects
(an attribute set to one, a list appended to, a tensor hook registered) or that steps an
optimizer (dynamo initialises the optimizer's state by calling `_init_group` on the real optimizer
while it traces) is refused before anything runs, and the region runs as eager with that reason.
"""
from __future__ import annotations

import contextlib
import weakref

import torch

from ...patching import PatchSet, declare

LIFT = declare("torch._subclasses.fake_tensor.FakeTensorConverter", "from_real_tensor",
               "while a compiled region is traced: a session tensor the region reads from a global, closure or "
               "object becomes a fake CUDA tensor of its shape (the session's tensors are meta underneath)")
SIDE_EFFECTS = declare("torch._dynamo.output_graph.OutputGraph", "call_user_compiler",
                       "while a compiled region is traced: a graph with side effects on Python objects is refused "
                       "before it runs (dynamo would apply them to the program's objects with fake values)")
LIFT_RUN = declare("torch._subclasses.fake_tensor.FakeTensorMode (the trace's own instance)",
                   "validate_and_convert_non_fake_tensors",
                   "while a compiled region is traced: the session tensors dynamo passes the graph it compiled "
                   "(read from globals, closures, objects) become their fakes, the fake run's only non-fake inputs")
OPTIMIZER = declare("torch._dynamo.variables.optimizer.OptimizerVariable", "call_method",
                    "while a compiled region is traced: an optimizer step is refused (dynamo would initialise the "
                    "program's optimizer state on the trace's tensors)")

SIDE_EFFECTS_REASON = ("its graph stores tensors into the program's objects (side effects the trace would apply "
                       "with its fake tensors)")
OPTIMIZER_REASON = ("it steps an optimizer: the step runs as inductor's compiled step takes memory (torch's fused "
                    "kernel, in place: its state made at the first step, capturable as dynamo sets it; no foreach "
                    "temporaries; compiled_optimizer.py)")


class RefusedRegion(RuntimeError):
    """A region the trace must not run to its end; `reason` is why it runs eager."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Lifted:
    """Which tensors read while a region is traced are the session's fake CUDA tensors."""

    def __init__(self, session):
        self.session = session
        self.graphs = 0   # graphs dynamo gave its backend
        self.sources: dict = {}   # id(session tensor) -> where dynamo read it (its guard's source)

    def is_session_cuda(self, t) -> bool:
        from torch._subclasses.fake_tensor import FakeTensor

        if not isinstance(t, torch.Tensor) or isinstance(t, FakeTensor) or t.device.type != "meta":
            return False
        return self.session.storages.device_of(t) == "cuda"


def _on_cuda(fake) -> None:
    """torch's fake of a session tensor (meta underneath) made to claim the CUDA device the session's
    tensors claim (a rank's own), as its base does where it is a view."""
    from .devices import cuda_index

    while fake is not None:
        fake.fake_device = torch.device("cuda", cuda_index())
        fake = fake._base


@contextlib.contextmanager
def guarded_trace(session, mode=None):
    """While a region is traced: session tensors read from outside its arguments made fake CUDA
    tensors, side effects and optimizer steps refused (yields the record, which counts the graphs)."""
    from torch._dynamo.output_graph import OutputGraph
    from torch._dynamo.variables.optimizer import OptimizerVariable
    from torch._subclasses.fake_tensor import FakeTensorConverter

    lifted = Lifted(session)
    from_real_tensor, call_user_compiler = FakeTensorConverter.from_real_tensor, OutputGraph.call_user_compiler

    def lift(self, fake_mode, tensor, *args, **kwargs):   # dynamo's inputs, and the trace's fake run
        out = from_real_tensor(self, fake_mode, tensor, *args, **kwargs)
        if lifted.is_session_cuda(tensor):
            _on_cuda(out)
            if kwargs.get("source") is not None:
                lifted.sources[id(tensor)] = kwargs["source"]
        return out

    def refuse_side_effects(self, gm, example_inputs):
        if _changes_existing_objects(self.side_effects):
            raise RefusedRegion(SIDE_EFFECTS_REASON)
        lifted.graphs += 1
        return call_user_compiler(self, gm, example_inputs)

    def refuse_optimizer(self, *args, **kwargs):
        raise RefusedRegion(OPTIMIZER_REASON)

    with PatchSet() as patches:
        patches.apply(LIFT, FakeTensorConverter, "from_real_tensor", lift)
        if mode is not None:
            _lift_in_run(patches, mode, lifted)
        patches.apply(SIDE_EFFECTS, OutputGraph, "call_user_compiler", refuse_side_effects)
        patches.apply(OPTIMIZER, OptimizerVariable, "call_method", refuse_optimizer)
        yield lifted


class Read:
    """One tensor a region read from outside its arguments: where dynamo read it, re-read at each call
    as dynamo's bytecode does (the trace's tensor is held weakly, so the program frees it as torch's)."""

    def __init__(self, tensor: torch.Tensor, source):
        self.expression = getattr(source, "name", None) if source is not None else None
        self.ref = weakref.ref(tensor)
        self.signature = (tuple(tensor.shape), tensor.stride(), tensor.dtype, tensor.requires_grad)

    def now(self, fn, args, kwargs):
        """The tensor this call reads (None: gone, or not the one the trace saw: trace again)."""
        t = _evaluate(self.expression, fn, args, kwargs) if self.expression else None
        t = t if isinstance(t, torch.Tensor) else self.ref()
        if t is None or (tuple(t.shape), t.stride(), t.dtype, t.requires_grad) != self.signature:
            return None
        return t


def _evaluate(expression: str, fn, args, kwargs):
    """A guard source's expression (`G['w']`, `L['self'].weight`) against the call's frame, as
    dynamo's guards evaluate it; None where it cannot be."""
    import inspect

    from torch._dynamo.guards import _get_closure_vars

    func = getattr(fn, "__func__", fn)
    try:
        local = dict(inspect.signature(fn).bind(*args, **kwargs).arguments)
        if hasattr(fn, "__self__"):
            local["self"] = fn.__self__
        cells = zip(func.__code__.co_freevars, func.__closure__ or ())
        local.update({name: cell.cell_contents for name, cell in cells})
        return eval(expression, {**_get_closure_vars(), "G": func.__globals__, "L": local})   # noqa: S307
    except Exception:
        return None


def _lift_in_run(patches: PatchSet, mode, lifted: Lifted) -> None:
    """The trace's fake mode takes the session tensors dynamo's compiled code is called with (it
    refuses every other non-fake input, as torch's does)."""
    validate = mode.validate_and_convert_non_fake_tensors

    def with_session_tensors(func, converter, flat_args, args_spec):
        flat_args = [converter.from_real_tensor(mode, a) if lifted.is_session_cuda(a) else a for a in flat_args]
        return validate(func, converter, flat_args, args_spec)
    patches.apply(LIFT_RUN, mode, "validate_and_convert_non_fake_tensors", with_session_tensors)


def _changes_existing_objects(side_effects) -> bool:
    """Whether dynamo would store tensors (the trace's fakes) into objects that existed before the
    region ran: attributes set to them, containers holding them, tensor hooks. (Objects the region
    made itself are the trace's own; Python values such as flags are the values eager would store.)"""
    from torch._dynamo.variables.base import AttributeMutationNew, ValueMutationNew

    new = (AttributeMutationNew, ValueMutationNew)
    for v in side_effects.id_to_variable.values():
        if isinstance(v.mutation_type, new) or not side_effects.is_modified(v):
            continue
        stored = side_effects.store_attr_mutations.get(v)
        if _holds_tensor(list(stored.values()) if stored else v):
            return True
    return bool(side_effects.tensor_hooks)


def _holds_tensor(vt, depth: int = 4) -> bool:
    from torch._dynamo.variables import BaseListVariable, ConstDictVariable, TensorVariable

    if isinstance(vt, TensorVariable):
        return True
    if depth == 0:
        return False
    if isinstance(vt, (list, tuple)):
        items = vt
    elif isinstance(vt, BaseListVariable):
        items = vt.items
    elif isinstance(vt, ConstDictVariable):
        items = list(vt.items.values())
    else:
        return False
    return any(_holds_tensor(x, depth - 1) for x in items)


def refusal(e: BaseException) -> str | None:
    """The reason a trace was refused, if it was (dynamo wraps what its callbacks raise)."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, RefusedRegion):
            return e.reason
        e = getattr(e, "inner_exception", None) or e.__cause__ or e.__context__
    return None
