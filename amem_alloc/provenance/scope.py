"""Where the program is: the module path (forward hooks), the phase, autocast, the model's tensors.

Module hooks: a pre-hook pushes the module's path, a post-hook (always_call, so an exception in
forward does not leave the stack wrong) pops it. The root's pre-hook also records the tensors
passed to the model: the profiler's "input" category. ModuleScope is the one module tracker: the
Tracer hooks its model's modules (ModuleScope(model, on_inputs)); prediction, which never sees the
model, hooks every module through torch's global hooks (ModuleScope.every_module()), naming each
by its path under the first module seen running that contains it.

Phase, from cheapest evidence first:
    backward   the autograd engine is running a graph task (torch._C._current_graph_task_id)
    optimizer  inside Optimizer.step (the global optimizer step hooks)
    forward    inside a forward of the traced model, or (decided later) the op's output joined the
               autograd graph, e.g. a loss computed outside the model
    other      everything else (data preparation, zero_grad, ops under no_grad outside the model)
"""
from __future__ import annotations

import weakref

import torch

# The running backward's graph task id, or -1 outside backward (torch >= 2.0; guarded).
_task_id = getattr(torch._C, "_current_graph_task_id", None) or (lambda: -1)
_current_node = getattr(torch._C, "_current_autograd_node", None)


def current_backward_node():
    """The autograd node whose backward is running on this thread, or None."""
    return _current_node() if _current_node is not None else None


def _autocast_on() -> bool:
    return any(torch.is_autocast_enabled(d) for d in ("cuda", "cpu"))


def tensors_in(values):
    """The tensors among args/kwargs values, one level deep into lists, tuples and dicts."""
    for v in values:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from (x for x in v if isinstance(x, torch.Tensor))
        elif isinstance(v, dict):
            yield from (x for x in v.values() if isinstance(x, torch.Tensor))


_MACHINERY = ("torch._dynamo.backends.distributed",)   # dynamo's DDP optimizer wraps each split graph in a module


def _machinery(module) -> bool:
    """A module torch's machinery made to run a compiled graph, not one of the program's: it takes no
    place in the module path (its ops belong to the module that called it)."""
    return type(module).__module__ in _MACHINERY


class ModuleScope:
    """The module stack (qualified paths, innermost last) and autocast state, kept by forward hooks:
    of one model's modules, or of every module (every_module())."""

    def __init__(self, model, on_inputs=None, hook_every_module: bool = False):
        self.model = model
        self.stack: list[str] = []
        self.autocast: list[bool] = []
        self.names: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> its path
        self._roots: list = []  # every_module: weak references to the outermost modules seen running, in order
        self._on_inputs = on_inputs  # called with the root's input tensors
        self._every_module = hook_every_module
        self._handles = []
        self.outermost: list = []   # fn("enter" | "exit") as an outermost module starts and returns
        self.new_root: list = []    # fn(module) as a module outside every root seen so far first runs

    @classmethod
    def every_module(cls) -> "ModuleScope":
        """The module running now in any model (torch's global module hooks)."""
        return cls(None, hook_every_module=True)

    # ---- hooks
    def install(self) -> None:
        if self._every_module:
            from torch.nn.modules import module as m

            self._handles = [m.register_module_forward_pre_hook(self._pre),
                             m.register_module_forward_hook(self._post, always_call=True)]
            return
        if self.model is None:
            return
        for name, module in self.model.named_modules():
            self.names[module] = name
            self._handles.append(module.register_forward_pre_hook(self._pre, with_kwargs=True))
            self._handles.append(module.register_forward_hook(self._post, always_call=True))

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _path(self, module) -> str:
        if module not in self.names:  # every_module: a module outside every root seen so far is a root
            self._add_root(module)
        return self.names[module]

    def _add_root(self, module) -> None:
        """`module` and its submodules named from it. A root seen earlier inside it (LLaVA's vision
        tower, run by `get_image_features` before the model's forward) is renamed from it and is a
        root no more: its modules' paths are the model's, as where the model runs it."""
        subs = {id(sub) for sub in module.modules()}
        inside = [r for r in self.roots if id(r) in subs]
        renamed = {id(sub) for r in inside for sub in r.modules()}
        for name, sub in module.named_modules():
            if sub not in self.names or id(sub) in renamed:
                self.names[sub] = name
        self._roots = [r for r in self._roots if r() is not None and all(r() is not i for i in inside)]
        self._roots.append(weakref.ref(module))
        for fn in self.new_root:
            fn(module)

    @property
    def roots(self) -> list:
        """The outermost modules seen running, in order, of those still alive: held weakly, so that a
        model the program deletes is freed as it is without the hooks (`del pipeline` between a
        DreamBooth run's class-image generation and its training)."""
        alive = [r() for r in self._roots]
        return [m for m in alive if m is not None]

    def _pre(self, module, args, kwargs=None):
        if _machinery(module):
            return
        name = self._path(module)
        if name == "" and not self.stack and self._on_inputs is not None:  # the model, called from outside
            self._on_inputs(list(tensors_in(args)) + list(tensors_in((kwargs or {}).values())))
        if not self.stack:
            for fn in self.outermost:
                fn("enter")
        self.stack.append(name)
        self.autocast.append(_autocast_on())

    def _post(self, module, args, output):
        if self.stack and not _machinery(module):
            self.stack.pop()
            self.autocast.pop()
            if not self.stack:
                for fn in self.outermost:
                    fn("exit")

    # ---- queries
    @property
    def module(self):
        """The innermost module path ("" = the model itself), or None outside the model."""
        return self.stack[-1] if self.stack else None

    @property
    def autocast_on(self) -> bool:
        return self.autocast[-1] if self.autocast else False

    def model_state(self) -> dict:
        """{storage key: ("parameter" | "buffer", name)} for the model's parameters and buffers."""
        from .accounting import storage_of

        out = {}
        if self.model is None:
            return out
        for kind, items in (("buffer", self.model.named_buffers()), ("parameter", self.model.named_parameters())):
            for name, t in items:
                facts = storage_of(t)
                if facts is not None:
                    out[facts[1]] = (kind, name)
        return out

    def parameters(self):
        return [] if self.model is None else list(self.model.parameters())
