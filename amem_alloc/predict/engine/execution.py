"""Fake execution: real CPU, fake CUDA. CPU work runs for real; CUDA tensors are meta tensors that
say "cuda"; torch's own autograd engine runs; every CUDA storage's life is recorded.

Design note
-----------
Everything that lives on the CPU is real: datasets, numpy, tokenizers, `torch.randint` and
`randperm`, samplers, DataLoader workers, collate functions, bookkeeping. An op whose inputs are
all real runs for real and records nothing (the process's own memory is never counted as GPU
memory). Only CUDA storages are fake: *meta* tensors with shape, dtype, strides and a storage of
a known size, but no data and no memory. Meta tensors go through torch's real dispatcher and its
real autograd engine (the C++ one: a fake CUDA device cannot, because the engine asks the CUDA
driver about streams and contexts), so every lifetime is torch's own: saved tensors and their
release after each node runs, gradient accumulation and stealing, views sharing a storage,
in-place ops, `del`, optimizer state, checkpointing.

A real CPU tensor that crosses to the device (`.to("cuda")`, `.cuda()`, a module's `.cuda()` with
its buffers) becomes a fake CUDA tensor of the same shape, dtype and strides, and the copy's
allocation is recorded. A fake tensor brought back (`loss.cpu()`) is a fake CPU tensor: it holds
no value either. Parameters are always fake (session.py): their values never decide what CUDA
allocates, and a 7B model built on the CPU would need 28 GB of RAM.

Which meta tensors are "CUDA" is kept beside them, per storage (`Storages`, storages.py). A
torch-function mode (`DeviceMode`) rewrites CUDA devices to meta on the way in and answers
`tensor.device`, `is_cuda`, `get_device()` as the user's code expects; it applies CUDA's autocast policy (meta tensors have
no autocast kernels: see autocast.py) and answers reads of a fake tensor's value with a stand-in
(values.py). A torch-dispatch mode (`Recorder`), below autograd, sees every aten op: each new
storage of an op on fake tensors is an allocation (its nominal bytes: the allocator rounds), and
a weak reference to the storage reports the free when torch drops the last reference. CUDA-only
allocations (workspaces, kernel temporaries, attention backends) come from cuda_rules.py (the
rules are in kernels/).
"""
from __future__ import annotations

import threading
import types
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from . import autocast as autocast_rules
from .. import rules as cuda_rules
from . import known as known_mod
from .. import notes as notes_mod
from . import values
from .storages import Storages
from .values import DataDependentError, is_fake

__all__ = ["DataDependentError", "DeviceMode", "Recorder", "is_fake", "unspoofed"]

META = torch.device("meta")


# ============================================================================ devices
_state = threading.local()


def _explicit_device() -> str | None:
    stack = getattr(_state, "devices", None)
    return stack[-1] if stack else None


def _implicit_device() -> str | None:
    """The device of the tensors of the torch function running now (None outside one)."""
    stack = getattr(_state, "implicit", None)
    return stack[-1] if stack else None


class _Implicit:
    def __init__(self, device: str | None):
        self.device = device

    def __enter__(self):
        if not hasattr(_state, "implicit"):
            _state.implicit = []
        _state.implicit.append(self.device)

    def __exit__(self, *exc):
        _state.implicit.pop()


class unspoofed:
    """Context manager: in this thread, fake tensors answer their real device (meta) to device
    queries, as they do inside an op. Saved-tensor unpack hooks run so (session.py): they see the
    tensors as the pack hooks saw them in forward, from inside the op that saved them."""

    def __enter__(self):
        _state.unspoofed = getattr(_state, "unspoofed", 0) + 1

    def __exit__(self, *exc):
        _state.unspoofed -= 1


def _spoofing() -> bool:
    return not getattr(_state, "unspoofed", 0)


class _Device:
    def __init__(self, device: str | None):
        self.device = device

    def __enter__(self):
        if not hasattr(_state, "devices"):
            _state.devices = []
        _state.devices.append(self.device)

    def __exit__(self, *exc):
        _state.devices.pop()


def _cuda_index() -> int:
    """The device a fake CUDA tensor claims: the current one (torch.cuda.set_device under prediction;
    a process of a distributed job uses the one device its LOCAL_RANK picked)."""
    from ..shims.cuda import _DEVICE
    return _DEVICE.index


def device_type(device: Any) -> str | None:
    """"cuda" / "cpu" / ... for a device argument (str, int, torch.device), None for none."""
    if device is None:
        return None
    if isinstance(device, int):
        return "cuda"
    return torch.device(device).type


_FACTORIES = None
_LIKE = {"empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like", "randint_like"}
def _factories() -> set:
    global _FACTORIES
    if _FACTORIES is None:
        from torch.utils._device import _device_constructors
        _FACTORIES = set(_device_constructors())
    return _FACTORIES


def _parse_to(func, args: tuple, kwargs: dict, type_of: Callable):
    """(target device type or None, to()'s other arguments as keywords) of Tensor.to/.cuda/.cpu;
    type_of(tensor) is the device type a tensor claims (for .to(other))."""
    nb = kwargs.get("non_blocking", False)
    fmt = kwargs.get("memory_format")
    if func is torch.Tensor.cuda:
        return "cuda", {"non_blocking": nb or (len(args) > 2 and bool(args[2])), "memory_format": fmt}
    if func is torch.Tensor.cpu:
        return "cpu", {"memory_format": fmt}
    rest = dict(kwargs)
    copy = rest.pop("copy", False)
    other = rest.pop("other", None)
    positional = list(args[1:])
    if positional and isinstance(positional[0], torch.Tensor):   # .to(other): its device and dtype
        other = positional.pop(0)
    if other is not None:
        device, dtype = type_of(other), other.dtype
        nb = bool(positional[0]) if positional else nb
        copy = bool(positional[1]) if len(positional) > 1 else copy
        return device, {"dtype": dtype, "non_blocking": nb, "copy": copy, "memory_format": fmt}
    if len(positional) > 3:   # to(device, dtype, non_blocking, copy): _parse_to takes no copy
        copy = bool(positional.pop(3))
    device, dtype, nb, fmt = torch._C._nn._parse_to(*positional, **rest)
    return (device.type if device is not None else None), {"dtype": dtype, "non_blocking": nb, "copy": copy,
                                                           "memory_format": fmt}


class DeviceMode(TorchFunctionMode):
    """Real CPU, fake CUDA: CPU work runs for real; CUDA tensors are meta tensors that answer as CUDA;
    reading a fake tensor's value gets a stand-in (values.py)."""

    def __init__(self, storages: Storages, session: Any):
        super().__init__()
        self.storages, self.session = storages, session
        self._opening = None   # the Python-level function whose body _open has just started
        self.getters = {torch.Tensor.device: self._device, torch.Tensor.is_cuda: lambda t: self._type(t) == "cuda",
                        torch.Tensor.is_cpu: lambda t: self._type(t) == "cpu",
                        torch.Tensor.is_meta: lambda t: False}

    def _type(self, t: torch.Tensor) -> str:
        kind = self.storages.device_of(t)
        if kind is None and _wrapper_subclass(type(t)):   # a DTensor is on its local tensor's device
            inner, _ = t.__tensor_flatten__()
            kind = self.storages.device_of(getattr(t, inner[0])) if inner else None
        return kind or "cpu"

    def _device(self, t: torch.Tensor) -> torch.device:
        kind = self._type(t)
        return torch.device("cuda", _cuda_index()) if kind == "cuda" else torch.device(kind)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._opening is not None:   # the first call in an opened body (see _open)
            if func is self._opening:
                self._opening = None
                return func(*args, **kwargs)
            self._opening = None
        getter = self.getters.get(getattr(func, "__self__", None))
        if getter is not None and getattr(func, "__name__", "") == "__get__":
            return getter(args[0]) if _spoofing() else func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if name in values.READS and args and isinstance(args[0], torch.Tensor) and args[0].device.type == "meta":
            return values.read(name, args[0], args, kwargs, self._type(args[0]), self.session.strict,
                               self.session.known.value(args[0]))
        if func is torch.Tensor.data_ptr:
            return self._data_ptr(func, args[0])
        if func is torch.Tensor.get_device:
            return _cuda_index() if self._type(args[0]) == "cuda" else -1
        if func in (torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu):
            return self._to(func, args, kwargs)
        if func in _factories() or (name in _LIKE and "device" in kwargs):
            return self._factory(func, args, kwargs)
        with _Implicit(self._call_device(args, kwargs)):   # for tensors its decomposition makes
            if autocast_rules.active():                      # from nothing (a wrapped scalar)
                return autocast_rules.call(func, name, args, kwargs, self)
            return cuda_rules.function(func, name, args, kwargs, self)

    def _data_ptr(self, func, t: torch.Tensor) -> int:
        """A fake tensor's address: its storage's fake address plus its offset (a meta tensor's own
        data_ptr is 0 for all, and programs key tensors by it)."""
        if t.device.type != "meta" or _wrapper_subclass(type(t)):
            return func(t)
        return self.storages.address(t.untyped_storage()) + t.storage_offset() * t.element_size()

    def opens(self, func) -> bool:
        """Whether `func` is a Python-level torch function whose body runs under this mode (see
        _open)."""
        return type(func) is types.FunctionType and func.__module__ in _OPENED_MODULES and func is not self._opening

    def call(self, func, args, kwargs):
        """Run a torch function as CUDA would: a Python-level one (F.multi_head_attention_forward,
        F.layer_norm, ...) with this mode on for the calls in its body, any other as it is."""
        if not self.opens(func):
            return func(*args, **kwargs)
        return self._open(func, args, kwargs)

    def _open(self, func, args, kwargs):
        """A torch function mode is popped while it handles a call, so the body of a Python-level
        function would run with no mode at all: its scaled_dot_product_attention would take the meta
        math path, its linears would miss autocast, its factories would make meta tensors. The body
        runs here with the mode pushed again, from a copy of the function whose own
        has_torch_function checks answer False (otherwise the body would hand itself back to the
        mode at its first line). A body that checks another way still hands itself back: that call
        (`_opening`) runs the old way, with the mode popped."""
        body = types.FunctionType(func.__code__, {**func.__globals__, **_NO_OVERRIDE}, func.__name__,
                                  func.__defaults__, func.__closure__)
        body.__kwdefaults__ = func.__kwdefaults__
        outer, self._opening = self._opening, func
        try:
            with self:
                return body(*args, **kwargs)
        finally:
            self._opening = outer

    def _call_device(self, args, kwargs) -> str | None:
        seen = None
        for a in _leaves(args, kwargs):
            if isinstance(a, torch.Tensor):
                kind = self.storages.device_of(a)
                if kind == "cuda":
                    return kind
                seen = seen or kind
        return seen

    def _factory(self, func, args, kwargs):
        name = getattr(func, "__name__", "factory")
        device = device_type(kwargs.get("device")) or ("cuda" if self.session.default_cuda() else "cpu")
        kwargs = dict(kwargs)
        if kwargs.pop("pin_memory", False) and device == "cpu":
            notes_mod.record(notes_mod.STAND_IN, "pinned host memory (pin_memory=True): ordinary host memory")
        if device in ("cpu", "meta"):
            return func(*args, **kwargs)   # the CPU is real: data, indices, bookkeeping; meta is asked for
        kwargs["device"] = META
        with _Device(device):
            out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor) and not _wrapper_subclass(type(out)) and self.storages.key_of(out) is None:
            self.storages.see(out, device, name)   # torch.tensor(data, device=) reaches no dispatch mode
            if out.numel() <= known_mod.MAX_ELEMENTS:   # nor does the value it holds (known.py)
                kwargs["device"] = "cpu"
                self.session.known.remember(out, func(*args, **kwargs))
        # (a DTensor's storage is a global-size stand-in: its local tensor is what was allocated)
        return out

    def _to(self, func, args, kwargs):
        t = args[0]
        target, options = _parse_to(func, args, kwargs, self._type)
        options = {k: v for k, v in options.items() if v is not None}
        source = self._type(t)
        if target is None or (target == "meta" and t.device.type == "meta"):
            target = source   # "meta" is a fake tensor's real device, as code below the mode sees it
        if target == "cpu" and t.device.type != "meta":
            return torch.Tensor.to(t, **options)            # real stays real
        if target == source:
            return torch.Tensor.to(t, **options)            # no device change: a copy only if asked
        with _Device(target):   # a copy across devices: torch copies even when nothing else changes
            return torch.Tensor.to(t, device=META, **{**options, "copy": True})


# Modules whose Python-level torch functions run their bodies under the mode (DeviceMode._open):
# torch.nn.functional and torch.functional, whose bodies call the ops that CUDA's autocast and the
# kernel rules must see. Tensor methods written in Python (torch._tensor: backward, __repr__, ...)
# keep running as they are.
_OPENED_MODULES = {"torch.nn.functional", "torch.functional"}
_NO_OVERRIDE = {name: (lambda *a, **k: False)
                for name in ("has_torch_function", "has_torch_function_unary", "has_torch_function_variadic")}


# ============================================================================ the recorder
_CREATE_ON_TARGET = {"_to_copy", "to", "copy"}


class Recorder(TorchDispatchMode):
    """Below autograd: every op's new storages are allocations on the op's device."""

    def __init__(self, storages: Storages, session: Any):
        super().__init__()
        self.storages, self.session = storages, session
        self.cache = _MetaCache()
        self._last_op, self._last_key = None, None

    def _fresh_zeros(self, t) -> bool:
        """Whether `t` is the zeros tensor the previous op just made (a formula's local result)."""
        return (self._last_op in _ZEROS and torch._C._current_graph_task_id() != -1
                and isinstance(t, torch.Tensor) and self.storages.key_of(t) == self.storages.last_key)

    def _see(self, out, device: str, op: str, host: tuple = ()) -> None:
        """Every tensor of an op's output: a new storage is an allocation on `device`, except the
        outputs at positions `host`, which CUDA's kernel keeps on the CPU (cuda_rules.host_outputs)."""
        if isinstance(out, torch.Tensor):
            self.storages.see(out, device, op)
            return
        for i, t in enumerate(t for t in tree_leaves(out) if isinstance(t, torch.Tensor)):
            self.storages.see(t, "cpu" if i in host else device, op)

    def _read_known(self, func, known, leaves):
        """A value or data-dependent shape read of known values (known.py): the true answer, with
        fake outputs of the true shapes that know their values."""
        device = self._device(func, leaves)
        make = lambda r: torch.empty_strided(tuple(r.shape), r.stride(), dtype=r.dtype, device=META)
        out = self.session.known.outputs_of(func, known, make)
        if any(isinstance(t, torch.Tensor) for t in tree_leaves(out)):
            self._see(out, device, func.__name__)
        return out

    def _device(self, func, leaves) -> str:
        explicit = _explicit_device()
        if explicit is not None and (func.__name__.split(".")[0] in _CREATE_ON_TARGET):
            return explicit
        seen = None
        for a in leaves:
            if isinstance(a, torch.Tensor):
                kind = self.storages.device_of(a)
                if kind == "cuda":
                    return "cuda"
                seen = seen or kind
        if seen is not None:
            return seen
        if explicit is not None:
            return explicit
        implicit = _implicit_device()
        if implicit is not None:
            return implicit
        if torch._C._current_graph_task_id() != -1:   # made by the engine (zeros for a missing
            return "cuda"                              # gradient) on the graph's device
        return "cuda" if self.session.default_cuda() else "cpu"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        with unspoofed():   # inside an op, fake tensors are what they are: meta
            return self._dispatch(func, types, args, kwargs)

    def _dispatch(self, func, types, args, kwargs):
        if any(_wrapper_subclass(t) for t in types):
            return NotImplemented   # a wrapper subclass (DTensor) first: its ops on plain tensors come back here
        kwargs = kwargs or {}
        if _fake_mode_active():   # DTensor's sharding propagation runs ops on global shapes under
            return func(*args, **kwargs)   # a FakeTensorMode of its own: shapes only, no allocation
        leaves = _leaves(args, kwargs)
        if kwargs.get("device") != META and not any(isinstance(a, torch.Tensor) and a.device.type == "meta"
                                                    for a in leaves):
            return func(*args, **kwargs)   # real CPU work: runs, nothing to record
        known = None if _decomposes(func) else self.session.known.inputs(func, args, kwargs, leaves)
        if known is not None and values.reads_values(func, args):   # known values: the true answer
            return self._read_known(func, known, leaves)
        strict = self.session.strict
        read = values.scalar_op(func, args, strict) or values.shape_op(func, args, kwargs, strict)
        if read is not None and not isinstance(read[0], torch.Tensor):
            return read[0]
        real = [a for a in leaves if isinstance(a, torch.Tensor) and a.device.type != "meta"]
        if read is not None:   # a shape from values, taken at its upper bound
            self._see(read[0], self._device(func, leaves), func.__name__)
            return read[0]
        if any(a.dim() > 0 for a in real):
            args, kwargs = _fakeify(args, kwargs)
            leaves = _leaves(args, kwargs)
        device = self._device(func, leaves)
        extra = cuda_rules.before_op(func, args, kwargs, self.session) if device == "cuda" else ()
        if _decomposes(func):   # with autograd off, composite ops reach the mode whole:
            with self:          # open them as CUDA would, so their inner allocations show
                out = func.decompose(*args, **kwargs)
            for key in extra:
                self.storages.on_free(key)
            return out
        inplace = _INPLACE_ON_FRESH.get(func.__name__) if device == "cuda" else None
        if inplace is not None and self._fresh_zeros(args[0]):
            out, known = inplace(*args, **kwargs), None   # see _INPLACE_ON_FRESH
        elif func is _ADD and device == "cuda" and not kwargs and len(args) == 2 and _accumulates(*args):
            a, b = args                      # see _accumulates
            out, known = a.add_(b) if _target(a) else b.add_(a), None
            self.session.known.forget(out)
        else:
            out = self.cache.run(func, args, kwargs, leaves) if not real else func(*args, **kwargs)
            if device == "cuda":
                out = cuda_rules.layout(func, args, kwargs, out)
        if known is not None:
            self.session.known.after(func, known, out)
        else:
            self.session.known.written(func, args, kwargs)
        self._last_op = func.__name__
        host = cuda_rules.host_outputs(func, args, kwargs) if device == "cuda" and not isinstance(out, torch.Tensor) \
            else ()
        self._see(out, device, func.__name__, host)
        for key in extra:   # the kernel's own temporaries die with the kernel
            self.storages.on_free(key)
        return out


_DECOMPOSES: dict = {}


def _fake_mode_active() -> bool:
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None


def _wrapper_subclass(kind: type) -> bool:
    """A tensor subclass that wraps plain tensors (DTensor: __tensor_flatten__), not FakeTensor."""
    return kind is not torch.Tensor and hasattr(kind, "__tensor_flatten__")


def _decomposes(func) -> bool:
    """Whether CUDA runs `func` as its CompositeImplicitAutograd decomposition (no CUDA kernel)."""
    hit = _DECOMPOSES.get(func)
    if hit is None:
        name = func.name()
        has = torch._C._dispatch_has_kernel_for_dispatch_key
        hit = has(name, "CompositeImplicitAutograd") and not has(name, "CUDA")
        _DECOMPOSES[func] = hit
    return hit


def _leaves(args, kwargs) -> list:
    """The arguments of an aten op, with lists and tuples of them (aten's only nesting) opened."""
    out = []
    for a in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(a, (list, tuple)):
            out.extend(a)
        else:
            out.append(a)
    return out


# Backward formulas (FunctionsManual.cpp) take out-of-place, "composite compliant" branches when
# any tensor is subclass-like, and meta tensors count as subclass-like (kTensorSubclassLike holds
# the Meta backend bit). Where the out-of-place op only fills a zeros tensor the formula has just
# made (gather's backward: new_zeros(...).scatter_add_; index's: new_zeros(...).index_put_ with
# accumulate; a max/min over a dim: zeros(...).scatter_), CUDA runs the in-place op on it: so does this.
_ZEROS = {"new_zeros.default", "zeros.default", "zeros_like.default"}
_INPLACE_ON_FRESH = {"scatter_add.default": torch.ops.aten.scatter_add_.default,
                     "scatter.src": torch.ops.aten.scatter_.src,      # max/min(dim)'s backward
                     "scatter.value": torch.ops.aten.scatter_.value,
                     "index_put.default": torch.ops.aten.index_put_.default}


# The autograd engine sums the gradients that reach one input (InputBuffer::accumulate) in place
# when the buffer holds the only reference to a dense gradient; for meta tensors (subclass-like)
# it always adds out of place. In backward, an add of two same-shaped dense tensors one of which
# nothing else holds is taken to be that accumulation, and made in place as on CUDA.
_ADD = torch.ops.aten.add.Tensor
_SOLE_USES = (4, 2)   # (tensor, storage) use counts of a tensor held only by its caller, as seen here


def _sole(t) -> bool:
    return (t._use_count(), torch._C._storage_Use_Count(t.untyped_storage()._cdata)) == _SOLE_USES


def _target(t) -> bool:
    """Whether the engine would add into `t` (non-overlapping and dense, and nothing else holds it)."""
    return _dense(t) and _sole(t)


def _dense(t) -> bool:
    """is_non_overlapping_and_dense: the elements fill their extent exactly, in some dim order."""
    expected = 1
    for size, stride in sorted((d for d in zip(t.shape, t.stride()) if d[0] != 1), key=lambda d: d[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def _accumulates(a, b) -> bool:
    return (torch._C._current_graph_task_id() != -1 and isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
            and a.shape == b.shape and a.dtype == b.dtype and (_target(a) or _target(b)))


class _MetaCache:
    """Output metadata of functional ops by input metadata. Many meta kernels are Python (torch's
    refs: about 2 ms an op); a model repeats the same shapes layer after layer, so an op that
    returns fresh tensors (no view, no in-place, no out=) is run once per input signature and
    afterwards its outputs are made with empty_strided (a few microseconds)."""

    def __init__(self):
        self.entries: dict = {}
        self.functional: dict = {}

    def _is_functional(self, func) -> bool:
        hit = self.functional.get(func)
        if hit is None:
            schema = func._schema
            hit = (not any(a.alias_info is not None for a in schema.arguments)
                   and not any(r.alias_info is not None for r in schema.returns)
                   and all(str(r.type) in ("Tensor", "Tensor[]") for r in schema.returns)
                   and not schema.is_mutable and func.__name__.split(".")[0] not in _NO_CACHE)
            self.functional[func] = hit
        return hit

    def run(self, func, args, kwargs, leaves):
        if not self._is_functional(func):
            return func(*args, **kwargs)
        try:
            key = (func, _signature(leaves))
        except _Unhashable:
            return func(*args, **kwargs)
        meta = self.entries.get(key)
        if meta is not None:
            return _make(meta)
        out = func(*args, **kwargs)
        meta = _describe(out)
        if meta is not None and _aliases(out, leaves):   # a view without an alias annotation
            self.functional[func], meta = False, None    # (_unsafe_view): never cached
        if meta is not None:
            self.entries[key] = meta
        return out


_NO_CACHE = {"_local_scalar_dense", "lift_fresh", "lift", "detach", "alias"}


class _Unhashable(Exception):
    pass


def _signature(leaves) -> tuple:
    out = []
    for a in leaves:
        if isinstance(a, torch.Tensor):
            out.append((tuple(a.shape), a.stride(), a.dtype, a.storage_offset(), a.requires_grad))
        elif isinstance(a, (int, float, bool, str, torch.dtype, torch.device, torch.layout,
                            torch.memory_format, type(None))):
            out.append((type(a), a))
        else:
            raise _Unhashable
    return tuple(out)


def _describe(out):
    """(is a tuple, [(shape, stride, dtype)]) of fresh dense outputs, or None (not cacheable)."""
    tensors = [out] if isinstance(out, torch.Tensor) else list(out) if isinstance(out, (tuple, list)) else None
    if tensors is None or not all(isinstance(t, torch.Tensor) for t in tensors):
        return None
    descs = []
    for t in tensors:
        if t.storage_offset() != 0 or t.untyped_storage().nbytes() != _extent(t):
            return None
        descs.append((tuple(t.shape), t.stride(), t.dtype))
    return (isinstance(out, torch.Tensor), type(out), descs)


def _aliases(out, leaves) -> bool:
    inputs = {a.untyped_storage()._cdata for a in leaves if isinstance(a, torch.Tensor)}
    outs = [out] if isinstance(out, torch.Tensor) else out
    return any(t.untyped_storage()._cdata in inputs for t in outs)


def _extent(t) -> int:
    if t.numel() == 0:
        return 0
    return (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))) * t.element_size()


def _make(meta):
    single, kind, descs = meta
    made = [torch.empty_strided(shape, stride, dtype=dtype, device=META) for shape, stride, dtype in descs]
    return made[0] if single else kind(made)


def _fakeify(args, kwargs):
    """Real tensors made before the session (a CPU constant, a numpy array) become meta tensors."""
    if not any(isinstance(a, torch.Tensor) and a.device.type != "meta" and a.dim() > 0
               for a in tree_leaves((args, kwargs))):
        return args, kwargs
    conv = lambda a: a.to(META) if isinstance(a, torch.Tensor) and a.device.type != "meta" and a.dim() > 0 else a
    return tree_map(conv, args), tree_map(conv, kwargs)
