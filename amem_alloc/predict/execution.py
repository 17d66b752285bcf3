"""Fake execution: meta tensors that say "cuda", torch's own autograd engine, and a record of every
CUDA storage's life.

Design note
-----------
Every tensor made while a session is active is a *meta* tensor: it has shape, dtype, strides and a
storage of a known size, but no data and no memory. Meta tensors go through torch's real
dispatcher and its real autograd engine (the C++ one: a fake CUDA device cannot, because the
engine asks the CUDA driver about streams and contexts), so every lifetime is torch's own:
autograd's saved tensors and their release after each node runs, gradient accumulation and
stealing, views sharing a storage, in-place ops, `del`, optimizer state, checkpointing.

Which meta tensors are "CUDA" is kept beside them, per storage (`Storages`): a factory call or a
`.to()/.cuda()` naming a CUDA device makes a CUDA storage, an op whose inputs include a CUDA tensor
makes CUDA outputs. A torch-function mode (`DeviceMode`) rewrites devices to meta on the way in
and answers `tensor.device`, `is_cuda`, `get_device()` as the user's code expects; it also applies
CUDA's autocast policy (meta tensors have no autocast kernels: see autocast.py) and turns reads of
values (`repr`, `tolist`, `numpy`) into DataDependentError. A torch-dispatch mode (`Recorder`),
below autograd, sees every aten op: each new storage it returns is an allocation (its nominal
bytes: the allocator rounds), and a weak reference to the storage reports the free when torch
drops the last reference. CUDA-only allocations (workspaces, kernel temporaries, attention backends)
come from cuda_rules.py (the rules are in kernels/).
"""
from __future__ import annotations

import itertools
import os
import sys
import threading
import weakref
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from . import autocast as autocast_rules
from . import cuda_rules

META = torch.device("meta")
_TORCH_DIR = os.path.dirname(torch.__file__)
_AMEM_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SKIP_DIRS = (_TORCH_DIR, _AMEM_DIR, os.path.dirname(os.__file__))


class DataDependentError(RuntimeError):
    """User code needed a tensor's value, which a prediction does not compute."""

    def __init__(self, what: str, frames: tuple = ()):
        self.what = what
        self.filename, self.lineno = (frames[0][0], frames[0][1]) if frames else (None, None)
        where = f"{self.filename}:{self.lineno}: " if frames else ""
        super().__init__(f"{where}{what} needs a tensor's value, which prediction does not compute "
                         "(no data is computed); remove it from the predicted step or guard it with "
                         "amem's prediction flag")


def user_frames(limit: int = 6) -> tuple:
    """(filename, line, function) of the caller's frames outside torch and amem, innermost first."""
    out, f = [], sys._getframe(1)
    while f is not None and len(out) < limit:
        name = f.f_code.co_filename
        if not name.startswith(_SKIP_DIRS) and not name.startswith("<frozen"):
            out.append((name, f.f_lineno, f.f_code.co_name))
        f = f.f_back
    return tuple(out)


# ============================================================================ which storages are CUDA
class Storages:
    """Every storage made inside the session: id(storage object) -> (key, device). Torch keeps one
    Python object per storage while any tensor holds it, so a weak reference to it fires exactly
    when the storage dies."""

    def __init__(self, on_alloc: Callable, on_free: Callable):
        self.by_id: dict[int, tuple[int, str, int]] = {}   # id -> (key, device, nbytes)
        self.refs: dict[int, weakref.ref] = {}              # id -> the weak reference that reports the free
        self.on_alloc, self.on_free = on_alloc, on_free
        self.next_key = itertools.count(1).__next__
        self.last_key = None   # the newest storage's key

    def device_of(self, t: torch.Tensor) -> str | None:
        if t.device.type != "meta":
            return t.device.type
        rec = self.by_id.get(id(t.untyped_storage()))
        return rec[1] if rec else None

    def key_of(self, t: torch.Tensor) -> int | None:
        rec = self.by_id.get(id(t.untyped_storage()))
        return rec[0] if rec else None

    def see(self, t: torch.Tensor, device: str, op: str) -> None:
        st = t.untyped_storage()
        sid, nbytes = id(st), st.nbytes()
        rec = self.by_id.get(sid)
        if rec is not None:
            if nbytes > rec[2]:   # resize_ grew it: torch allocates a new block and frees the old
                self._died(sid, rec[0], rec[1])
                key, device = self._new(sid, device, nbytes, op, t)
                self.refs[sid] = weakref.ref(st, lambda _, sid=sid, key=key, device=device: self._died(sid, key, device))
            return
        key, device = self._new(sid, device, nbytes, op, t)
        self.refs[sid] = weakref.ref(st, lambda _, sid=sid, key=key, device=device: self._died(sid, key, device))

    def _new(self, sid: int, device: str, nbytes: int, op: str, t: torch.Tensor) -> tuple[int, str]:
        key = self.next_key()
        self.last_key = key
        self.by_id[sid] = (key, device, nbytes)
        if device == "cuda" and nbytes > 0:   # torch's allocator records nothing for 0 bytes
            self.on_alloc(key, nbytes, op, t)
        return key, device

    def _died(self, sid: int, key: int, device: str) -> None:
        rec = self.by_id.get(sid)
        if rec is not None and rec[0] == key:
            del self.by_id[sid]
            self.refs.pop(sid, None)
            if device == "cuda" and rec[2] > 0:
                self.on_free(key)

    def alloc_extra(self, nbytes: int, op: str) -> int:
        """An allocation a CUDA kernel or library makes that no tensor shows (a workspace)."""
        key = self.next_key()
        self.on_alloc(key, nbytes, op, None)
        return key


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


class _Device:
    def __init__(self, device: str | None):
        self.device = device

    def __enter__(self):
        if not hasattr(_state, "devices"):
            _state.devices = []
        _state.devices.append(self.device)

    def __exit__(self, *exc):
        _state.devices.pop()


def device_type(device: Any) -> str | None:
    """"cuda" / "cpu" / ... for a device argument (str, int, torch.device), None for none."""
    if device is None:
        return None
    if isinstance(device, int):
        return "cuda"
    return torch.device(device).type


_FACTORIES = None
_LIKE = {"empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like", "randint_like"}
_VALUE_READS = {"__repr__", "__str__", "__format__", "tolist", "numpy", "__array__", "__dlpack__"}


_SCALAR_DATA = {"tensor", "scalar_tensor", "as_tensor", "asarray"}


def _is_scalar_factory(func, args, kwargs) -> bool:
    """Whether a CPU factory call makes a tensor of at most one element."""
    name = getattr(func, "__name__", "")
    if name in _SCALAR_DATA:
        return bool(args) and isinstance(args[0], (int, float, bool))
    if name in ("zeros", "ones", "empty", "full"):
        size = args[0] if args and isinstance(args[0], (tuple, list, torch.Size)) else args[:1] if name == "full" else args
        try:
            n = 1
            for d in size:
                n *= int(d)
            return n <= 1
        except (TypeError, ValueError):
            return False
    return False


def _factories() -> set:
    global _FACTORIES
    if _FACTORIES is None:
        from torch.utils._device import _device_constructors
        _FACTORIES = set(_device_constructors())
    return _FACTORIES


def _to_target(args: tuple, kwargs: dict) -> tuple[Any, tuple, dict]:
    """(target device or None, args, kwargs with the device replaced by meta) for Tensor.to."""
    target = kwargs.get("device")
    if target is not None:
        kwargs = {**kwargs, "device": META}
        return target, args, kwargs
    rest = list(args[1:])
    for i, a in enumerate(rest):
        if isinstance(a, (str, torch.device, int)) and not isinstance(a, bool):
            if isinstance(a, int) and i > 0:
                break
            rest[i] = META
            return a, (args[0], *rest), kwargs
        if isinstance(a, torch.Tensor):   # .to(other): other's device and dtype
            return ("other", a), args, kwargs
        if isinstance(a, torch.dtype):
            break
    return None, args, kwargs


class DeviceMode(TorchFunctionMode):
    """Rewrites devices to meta and answers device queries as CUDA for CUDA storages."""

    def __init__(self, storages: Storages, session: Any, spoof: bool = True):
        super().__init__()
        self.storages, self.session = storages, session
        self.spoof = spoof   # answer device queries as CUDA (off inside backward: see session.py)
        self.getters = {torch.Tensor.device: self._device, torch.Tensor.is_cuda: lambda t: self._type(t) == "cuda",
                        torch.Tensor.is_cpu: lambda t: self._type(t) == "cpu",
                        torch.Tensor.is_meta: lambda t: False}

    def _type(self, t: torch.Tensor) -> str:
        return self.storages.device_of(t) or "cpu"

    def _device(self, t: torch.Tensor) -> torch.device:
        kind = self._type(t)
        return torch.device("cuda", 0) if kind == "cuda" else torch.device(kind)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        getter = self.getters.get(getattr(func, "__self__", None))
        if getter is not None and getattr(func, "__name__", "") == "__get__":
            return getter(args[0]) if self.spoof else func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if name in _VALUE_READS and args and isinstance(args[0], torch.Tensor):
            raise DataDependentError(f"{name.strip('_')}() of a tensor", user_frames())
        if func is torch.Tensor.get_device:
            return 0 if self._type(args[0]) == "cuda" else -1
        if func in (torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu):
            return self._to(func, args, kwargs)
        if func is torch.Tensor.pin_memory or func is torch.Tensor.is_pinned:
            return args[0] if func is torch.Tensor.pin_memory else False
        if func in _factories() or (name in _LIKE and "device" in kwargs):
            return self._factory(func, args, kwargs)
        with _Implicit(self._call_device(args, kwargs)):   # for tensors its decomposition makes
            if autocast_rules.active():                      # from nothing (a wrapped scalar)
                return autocast_rules.call(func, name, args, kwargs, self)
            return cuda_rules.function(func, name, args, kwargs, self)

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
        device = device_type(kwargs.get("device")) or ("cuda" if self.session.default_cuda() else "cpu")
        if device == "cpu" and _is_scalar_factory(func, args, kwargs):
            return func(*args, **kwargs)   # a CPU scalar (an optimizer's step count) stays real: it is read
        kwargs = {**kwargs, "device": META}
        kwargs.pop("pin_memory", None)
        with _Device(device):
            return func(*args, **kwargs)

    def _to(self, func, args, kwargs):
        t = args[0]
        if func is torch.Tensor.cuda:
            target, args, kwargs = "cuda", (t,), {"non_blocking": kwargs.get("non_blocking", False)}
        elif func is torch.Tensor.cpu:
            target, args, kwargs = "cpu", (t,), {}
        else:
            target, args, kwargs = _to_target(args, kwargs)
            if isinstance(target, tuple):   # .to(other tensor)
                other = target[1]
                target = self._type(other)
                args, kwargs = (t, other.dtype), kwargs
        if func is not torch.Tensor.to:
            args, kwargs = (t, META), kwargs
        kind = device_type(target) if target is not None else None
        source = self._type(t)
        if t.device.type != "meta":   # a real tensor made before the session: becomes fake
            with _Device(kind or source):
                rest = [a for a in args[1:] if not (isinstance(a, torch.device) and a == META)]
                return torch.Tensor.to(t, *rest, **{**kwargs, "device": META})
        if kind is None or kind == source:
            return torch.Tensor.to(*args, **kwargs)
        with _Device(kind):   # a copy across devices: torch copies even when nothing else changes
            return torch.Tensor.to(*args, **{**kwargs, "copy": True})


# ============================================================================ the recorder
_DATA_OPS = None


def _data_ops() -> set:
    global _DATA_OPS
    if _DATA_OPS is None:
        aten = torch.ops.aten
        _DATA_OPS = {aten._local_scalar_dense.default, aten.is_nonzero.default, aten.equal.default,
                     aten.nonzero.default, aten.unique.default if hasattr(aten, "unique") else None,
                     aten._unique2.default, aten.masked_select.default}
        _DATA_OPS.discard(None)
    return _DATA_OPS


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
        kwargs = kwargs or {}
        leaves = _leaves(args, kwargs)
        real = [a for a in leaves if isinstance(a, torch.Tensor) and a.device.type != "meta"]
        if func in _data_ops() and len(real) < sum(isinstance(a, torch.Tensor) for a in leaves):
            raise DataDependentError(f"{func.__name__.split('.')[0].strip('_')} (a tensor's value)",
                                     user_frames())
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
            out = inplace(*args, **kwargs)   # see _INPLACE_ON_FRESH
        elif func is _ADD and device == "cuda" and not kwargs and len(args) == 2 and _accumulates(*args):
            a, b = args                      # see _accumulates
            out = a.add_(b) if _target(a) else b.add_(a)
        else:
            out = self.cache.run(func, args, kwargs, leaves) if not real else func(*args, **kwargs)
        op = func.__name__
        self._last_op = op
        if isinstance(out, torch.Tensor):
            self.storages.see(out, device, op)
        else:
            host = cuda_rules.host_outputs(func, args, kwargs) if device == "cuda" else ()
            for i, t in enumerate(t for t in tree_leaves(out) if isinstance(t, torch.Tensor)):
                self.storages.see(t, "cpu" if i in host else device, op)
        for key in extra:   # the kernel's own temporaries die with the kernel
            self.storages.on_free(key)
        return out


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
