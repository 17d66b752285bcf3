"""Recorder: the dispatch level of fake execution. Below autograd it sees every aten op; each new
storage of an op on fake tensors is an allocation on the op's device, and what CUDA's kernels and
autograd engine do beyond the meta kernels comes from the rules (rules/: the AUTOGRAD, KERNEL,
LAYOUT and HOST_OUTPUTS stages). engine/__init__.py says how the pieces fit.

An op goes through these steps, each a small method below:

1. pass through: a wrapper subclass (DTensor) first, torch's own FakeTensorMode (DTensor's sharding
   propagation on global shapes), and real CPU work run as they are and record nothing;
2. values: a read of known values gets the true answer (known.py); a scalar read or a
   data-dependent shape gets a stand-in (values.py);
3. the op itself: the kernel's temporaries are taken (KERNEL rules), an AUTOGRAD rule may do what
   CUDA's engine does instead, else the meta kernel runs (through the meta cache) and its output is
   laid out as CUDA's kernel lays it (LAYOUT rules); composite ops with no CUDA kernel are opened;
4. the outputs are seen (new storages are allocations, HOST_OUTPUTS rules aside) and the kernel's
   temporaries freed.
"""
from __future__ import annotations

from typing import Any

import torch
from torch._library.custom_ops import OPDEFS
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from .. import notes, rules
from . import values
from .devices import META, explicit_device, implicit_device, leaves, unspoofed, wrapper_subclass
from .meta_cache import MetaCache
from .storages import Storages, refuse_sparse

_CREATE_ON_TARGET = {"_to_copy", "to", "copy"}   # ops whose output goes to the copy's target device
_UNANSWERED = object()


CUSTOM_OP_FAKE = ("custom op {op} (torch.library.custom_op): its registered fake kernel stands in, which makes "
                  "only its outputs; the temporaries its implementation makes on the GPU are not counted")


def _is_custom_op(func) -> bool:
    """Whether `func` is an op a program defined with torch.library.custom_op (modded-nanogpt's FP8
    matmul). Its implementation cannot run here: it may call compiled code or kernels of its own
    (the FP8 matmul's body is a compiled function), so on fake tensors torch runs its fake kernel."""
    schema = getattr(func, "_schema", None)   # (every CUDA op asks: one dict lookup)
    definition = OPDEFS.get(schema.name) if schema is not None else None
    return definition is not None and not _defined_by_torch(definition)


def _defined_by_torch(definition) -> bool:
    """torch defines some of its own ops with custom_op too (torch 2.14's prims): those are torch's
    primitives, whose outputs are all they make."""
    module = getattr(getattr(definition, "_init_fn", None), "__module__", None) or ""
    return module == "torch" or module.startswith("torch.")


class Recorder(TorchDispatchMode):
    """Below autograd: every op's new storages are allocations on the op's device."""

    def __init__(self, storages: Storages, session: Any):
        super().__init__()
        self.storages, self.session = storages, session
        self.cache = MetaCache()
        self.last_op = None   # the previous op's name (AUTOGRAD rules ask what it made)
        self.closed = False   # the session ended: a program's thread still running passes calls through

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.closed:
            return func(*args, **(kwargs or {}))
        with unspoofed():   # inside an op, fake tensors are what they are: meta
            return self._dispatch(func, types, args, kwargs or {})

    def _dispatch(self, func, types, args, kwargs):
        if any(wrapper_subclass(t) for t in types):
            return NotImplemented   # a wrapper subclass (DTensor) first: its ops on plain tensors come back here
        if _fake_mode_active():   # DTensor's sharding propagation runs ops on global shapes under
            return func(*args, **kwargs)   # a FakeTensorMode of its own: shapes only, no allocation
        args_leaves = leaves(args, kwargs)
        if not _asks_meta(args_leaves) and not any(_is_meta(a) for a in args_leaves):
            return func(*args, **kwargs)   # real CPU work: runs, nothing to record
        known = None if _decomposes(func) else self.session.known.inputs(func, args, kwargs, args_leaves)
        answer = self._from_values(func, args, kwargs, args_leaves, known)
        if answer is not _UNANSWERED:
            return answer
        return self._run(func, args, kwargs, args_leaves, known)

    # ------------------------------------------------------------------ step 2: values
    def _from_values(self, func, args, kwargs, args_leaves, known):
        """The answer from values, or _UNANSWERED: known values' true answer, a scalar read's
        stand-in, or a data-dependent shape at its upper bound (values.py)."""
        if known is not None and values.reads_values(func, args, kwargs):
            return self._read_known(func, known, args_leaves)
        strict = self.session.strict
        read = values.scalar_op(func, args, strict) or values.shape_op(
            func, args, kwargs, strict, self.session.known, self.session.shape_rule())
        if read is None:
            return _UNANSWERED
        if any(isinstance(t, torch.Tensor) for t in tree_leaves(read[0])):   # a shape from values (every
            self._see(read[0], self._device(func, args_leaves), func.__name__)   # output: ctc_loss's two)
        return read[0]

    def _read_known(self, func, known, args_leaves):
        """A value or data-dependent shape read of known values (known.py): the true answer, with
        fake outputs of the true shapes that know their values."""
        device = self._device(func, args_leaves)
        make = lambda r: torch.empty_strided(tuple(r.shape), r.stride(), dtype=r.dtype, device=META)  # noqa: E731
        out, other = self.session.known.outputs_of(func, known, make)
        if other is not None:   # sized from assumed values: noted with the other rule's size
            values.note_known_size(func, out, other, self.session.shape_rule())
        if any(isinstance(t, torch.Tensor) for t in tree_leaves(out)):
            self._see(out, device, func.__name__)
        return out

    # ------------------------------------------------------------------ step 3: the op
    def _run(self, func, args, kwargs, args_leaves, known):
        real = [a for a in args_leaves if isinstance(a, torch.Tensor) and a.device.type != "meta"]
        if real and not _decomposes(func) and self.session.known.writes_real(func, args, kwargs):
            # a real tensor written from fake ones (losses[k] = loss): on the CPU, with known values or stand-ins
            return self.session.known.into_real(func, args, kwargs, self.storages.device_of)
        if any(a.dim() > 0 for a in real) and not _decomposes(func) and not rules.host_inputs(func, args, kwargs):
            # (a composite opened below meets its host tensors op by op: a copy of known data to the
            # device, `to.dtype_layout` under inference mode, keeps their values)
            args, kwargs = _fakeify(args, kwargs)
            args_leaves = leaves(args, kwargs)
        device = self._device(func, args_leaves, asked=_asks_meta(args_leaves))
        if device == "cuda":
            refuse_sparse(func, args_leaves, kwargs)
        temporaries = rules.before_op(func, args, kwargs, self.session) if device == "cuda" else ()
        if device == "cuda" and "cudnn" in func.__name__:   # cudnn_batch_norm, cuDNN attention: cuDNN starts
            self.session.uses("cudnn")
        if device == "cuda" and _is_custom_op(func):   # the program's own op: its fake kernel answers
            notes.record(notes.NOT_MODELLED, CUSTOM_OP_FAKE.format(op=func._schema.name))
        if _decomposes(func):   # with autograd off, composite ops reach the mode whole:
            with self:          # open them as CUDA would, so their inner allocations show
                out = func.decompose(*args, **kwargs)
            self._free(temporaries)
            return out
        out = rules.instead_of_op(func, args, kwargs, self) if device == "cuda" else rules.NOT_APPLICABLE
        if out is rules.NOT_APPLICABLE:
            out = self.cache.run(func, args, kwargs, args_leaves) if not real else func(*args, **kwargs)
            if device == "cuda":
                out = rules.layout(func, args, kwargs, out)
        else:
            known = None   # an in-place update the rule made: what the op wrote is unknown
        self._learn_values(func, args, kwargs, known, out)
        self.last_op = func.__name__
        host = rules.host_outputs(func, args, kwargs) if device == "cuda" and not isinstance(out, torch.Tensor) else ()
        self._see(out, device, func.__name__, host)
        self._free(temporaries)   # the kernel's own temporaries die with the kernel
        return out

    def _learn_values(self, func, args, kwargs, known, out) -> None:
        """Known inputs: the op runs on their values. Otherwise what it writes is unknown, and what
        the op still tells of its outputs (assumed values, counts: rules/data_dependent.py) is kept."""
        known_values = self.session.known
        if known is not None:
            known_values.after(func, args, kwargs, known, out)
            return
        facts = rules.values(func, args, kwargs, out, known_values, self.session.shape_rule())
        known_values.written(func, args, kwargs)
        known_values.learn(facts)
        known_values.pass_awaited(args, kwargs, out)

    def _free(self, keys) -> None:
        for key in keys:
            self.storages.on_free(key)

    # ------------------------------------------------------------------ step 4: the outputs
    def _see(self, out, device: str, op: str, host: tuple = ()) -> None:
        """Every tensor of an op's output: a new storage is an allocation on `device`, except the
        outputs at positions `host`, which CUDA's kernel keeps on the CPU (HOST_OUTPUTS rules)."""
        if isinstance(out, torch.Tensor):
            self.storages.see(out, device, op)
            return
        for i, t in enumerate(t for t in tree_leaves(out) if isinstance(t, torch.Tensor)):
            self.storages.see(t, "cpu" if i in host else device, op)

    def _device(self, func, args_leaves, asked: bool = False) -> str:
        """The device of an op's outputs: a copy's target or the device the call asked for
        (`empty_like(t, device=...)`: `asked`), else CUDA if any input is, else the inputs', the
        call's, the backward graph's (CUDA), or the default device."""
        explicit = explicit_device()
        if explicit is not None and (asked or func.__name__.split(".")[0] in _CREATE_ON_TARGET):
            return explicit
        seen = None
        for a in args_leaves:
            if isinstance(a, torch.Tensor):
                kind = self.storages.device_of(a)
                if kind == "cuda":
                    return "cuda"
                seen = seen or kind
        return seen or explicit or implicit_device() or self._without_inputs()

    def _without_inputs(self) -> str:
        if torch._C._current_graph_task_id() != -1:   # made by the engine (zeros for a missing
            return "cuda"                              # gradient) on the graph's device
        return "cuda" if self.session.default_cuda() else "cpu"


def _asks_meta(args_leaves) -> bool:
    """The call names the fake device, as a keyword or by position (the dispatcher passes a
    prim's device by position: inductor's `inductor_seeds(count, device)`)."""
    return any(isinstance(a, torch.device) and a == META for a in args_leaves)


def _is_meta(a) -> bool:
    return isinstance(a, torch.Tensor) and a.device.type == "meta"


def _fake_mode_active() -> bool:
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None


_DECOMPOSES: dict = {}


def _decomposes(func) -> bool:
    """Whether CUDA runs `func` as its CompositeImplicitAutograd decomposition (no CUDA kernel)."""
    hit = _DECOMPOSES.get(func)
    if hit is None:
        name = func.name()
        has = torch._C._dispatch_has_kernel_for_dispatch_key
        hit = has(name, "CompositeImplicitAutograd") and not has(name, "CUDA")
        _DECOMPOSES[func] = hit
    return hit


def _fakeify(args, kwargs):
    """Real tensors made before the session (a CPU constant, a numpy array) become meta tensors."""
    if not any(isinstance(a, torch.Tensor) and a.device.type != "meta" and a.dim() > 0
               for a in tree_leaves((args, kwargs))):
        return args, kwargs
    conv = lambda a: a.to(META) if isinstance(a, torch.Tensor) and a.device.type != "meta" and a.dim() > 0 else a  # noqa: E731
    return tree_map(conv, args), tree_map(conv, kwargs)
