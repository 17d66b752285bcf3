"""DeviceMode: the torch-function level of fake execution. CPU work runs for real; CUDA tensors are
meta tensors that answer as CUDA (`.device`, `is_cuda`, `get_device()`, `data_ptr()`); factories and
`.to()`/`.cuda()` put fake tensors on CUDA; CUDA's autocast policy applies (autocast.py); a read of
a fake tensor's value gets a stand-in (values.py); calls that CUDA routes differently from a meta
tensor meet the rules (rules/, the FUNCTION stage). engine/__init__.py says how the pieces fit.
"""
from __future__ import annotations

import threading
import types
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from ...user_script import for_the_script
from .. import notes as notes_mod
from .. import rules
from . import autocast as autocast_rules
from . import data_setter
from . import known as known_mod
from . import legacy_types
from . import values
from .devices import META, Implicit, OnDevice, cuda_index, device_type, leaves, spoofing, wrapper_subclass
from .storages import Storages


_FACTORIES = None
_FROM_DATA = {"tensor", "as_tensor", "asarray"}   # factories of (nested) data, which may hold tensors
_LIKE = {"empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like", "randint_like"}


def _makes_on_cuda(func, name: str, args, kwargs) -> bool:
    """A public torch function given a CUDA device and no tensor makes its tensor there, whether or
    not torch lists it as a device constructor (torch.normal(0.0, 1.0, size, device="cuda"): Opacus'
    noise). Not any function that takes a device: `torch._C._nn._parse_to(device="cuda")`, which
    Module.to calls to read its arguments, makes nothing and must answer cuda. (amem's own calls
    name the fake device, meta, and take their own path.)"""
    device = kwargs.get("device")
    return (device is not None and device_type(device) == "cuda" and not name.startswith("_")
            and getattr(torch, name, None) is func
            and not any(isinstance(a, torch.Tensor) for a in tree_leaves(args)))


def _cuda_ordinal(device) -> int | None:
    """The index a CUDA device argument names ("cuda:1", torch.device("cuda", 1)), else None."""
    if isinstance(device, str) and device.startswith("cuda:"):
        device = torch.device(device)
    if isinstance(device, torch.device) and device.type == "cuda":
        return device.index
    return None


INVALID_ORDINAL = ("CUDA error: invalid device ordinal (cuda:{index}: the process is predicted with {count} "
                   "device{s}; a prediction gives each process the devices its launcher gives it)")


def _factories() -> set:
    global _FACTORIES
    if _FACTORIES is None:
        from torch.utils._device import _device_constructors
        _FACTORIES = set(_device_constructors())
    return _FACTORIES


def _parse_to(func, args: tuple, kwargs: dict, type_of: Callable):
    """(target device type or None, the CUDA index it names or None, to()'s other arguments as
    keywords) of Tensor.to/.cuda/.cpu; type_of(tensor) is the device type a tensor claims (for
    .to(other))."""
    nb = kwargs.get("non_blocking", False)
    fmt = kwargs.get("memory_format")
    if func is torch.Tensor.cuda:
        device = args[1] if len(args) > 1 else kwargs.get("device")
        index = device if isinstance(device, int) else _cuda_ordinal(device)
        return "cuda", index, {"non_blocking": nb or (len(args) > 2 and bool(args[2])), "memory_format": fmt}
    if func is torch.Tensor.cpu:
        return "cpu", None, {"memory_format": fmt}
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
        return device, None, {"dtype": dtype, "non_blocking": nb, "copy": copy, "memory_format": fmt}
    if len(positional) > 3:   # to(device, dtype, non_blocking, copy): _parse_to takes no copy
        copy = bool(positional.pop(3))
    device, dtype, nb, fmt = torch._C._nn._parse_to(*positional, **rest)
    return (device.type if device is not None else None), _cuda_ordinal(device), \
        {"dtype": dtype, "non_blocking": nb, "copy": copy, "memory_format": fmt}


class DeviceMode(TorchFunctionMode):
    """Real CPU, fake CUDA: CPU work runs for real; CUDA tensors are meta tensors that answer as CUDA;
    reading a fake tensor's value gets a stand-in (values.py)."""

    def __init__(self, storages: Storages, session: Any):
        super().__init__()
        self.storages, self.session = storages, session
        self.closed = False   # the session ended: a program's thread still running passes calls through
        self._per_thread = threading.local()   # _opening, per thread (the program's threads run this mode too)
        self.getters = {torch.Tensor.device: self._device, torch.Tensor.is_cuda: lambda t: self._type(t) == "cuda",
                        torch.Tensor.is_cpu: lambda t: self._type(t) == "cpu",
                        torch.Tensor.is_meta: lambda t: self._type(t) == "meta"}
        # Tensor methods a fake tensor answers as a CUDA tensor does (func -> handler(func, args, kwargs))
        self.methods = {torch.Tensor.data_ptr: self._data_ptr, torch.Tensor.get_device: self._get_device,
                        torch.Tensor.to: self._to, torch.Tensor.cuda: self._to, torch.Tensor.cpu: self._to,
                        torch.Tensor.type: self._legacy_type, torch.Tensor.data.__set__: data_setter.set_data,
                        torch.Tensor.grad.__set__: self._set_grad}

    def _type(self, t: torch.Tensor) -> str:
        kind = self.storages.device_of(t)
        if kind is None and wrapper_subclass(type(t)):   # a DTensor is on its local tensor's device
            inner, _ = t.__tensor_flatten__()
            kind = self.storages.device_of(getattr(t, inner[0])) if inner else None
        return kind or "cpu"

    def _device(self, t: torch.Tensor) -> torch.device:
        kind = self._type(t)
        return torch.device("cuda", cuda_index()) if kind == "cuda" else torch.device(kind)

    @property
    def _opening(self):
        """The Python-level function whose body _open has just started, in this thread."""
        return getattr(self._per_thread, "opening", None)

    @_opening.setter
    def _opening(self, func) -> None:
        self._per_thread.opening = func

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.closed:
            return func(*args, **kwargs)
        if self._opening is not None:   # the first call in an opened body (see _open)
            if func is self._opening:
                self._opening = None
                return func(*args, **kwargs)
            self._opening = None
        getter = self.getters.get(getattr(func, "__self__", None))
        if getter is not None and getattr(func, "__name__", "") == "__get__":
            return getter(args[0]) if spoofing() else func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if name in values.READS and args and isinstance(args[0], torch.Tensor) and args[0].device.type == "meta":
            return values.read(name, args[0], args, kwargs, self._type(args[0]), self.session.strict,
                               self.session.known, self.session.shape_rule())
        method = self.methods.get(func)
        if method is not None:
            return method(func, args, kwargs)
        if func in _factories() or (name in _LIKE and "device" in kwargs) or _makes_on_cuda(func, name, args, kwargs):
            return self._factory(func, args, kwargs)
        with Implicit(self._call_device(args, kwargs)):   # for tensors its decomposition makes
            if autocast_rules.active():                     # from nothing (a wrapped scalar)
                return autocast_rules.call(func, name, args, kwargs, self)
            return rules.function(func, name, args, kwargs, self)

    def _read_elements(self, data):
        """`torch.tensor([[norm, ...], ...])` of CUDA scalars reads each one's value (torch copies
        them to the CPU one by one): read as `.item()` is, where fake tensors hold none."""
        if isinstance(data, (list, tuple)):
            return type(data)(self._read_elements(x) for x in data)
        if isinstance(data, torch.Tensor) and data.device.type == "meta" and not wrapper_subclass(type(data)):
            return values.read("item", data, (data,), {}, self._type(data), self.session.strict,
                               self.session.known, self.session.shape_rule())
        return data

    def _set_grad(self, func, args, kwargs) -> None:
        return data_setter.set_grad(func, args, kwargs, self._type, self._known)

    def _get_device(self, func, args, kwargs) -> int:
        return cuda_index() if self._type(args[0]) == "cuda" else -1

    def _data_ptr(self, func, args, kwargs) -> int:
        """A fake tensor's address: its storage's fake address plus its offset (a meta tensor's own
        data_ptr is 0 for all, and programs key tensors by it)."""
        t = args[0]
        if t.device.type != "meta" or wrapper_subclass(type(t)):
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
        for a in leaves(args, kwargs):
            if isinstance(a, torch.Tensor):
                kind = self.storages.device_of(a)
                if kind == "cuda":
                    return kind
                seen = seen or kind
        return seen

    def _legacy_type(self, func, args, kwargs):
        """Tensor.type(): the legacy type's name ("torch.cuda.FloatTensor" for a fake CUDA tensor);
        Tensor.type(T) with a legacy type (legacy_types.py): the tensor itself where it is of that
        type already, else a copy to its device and dtype, as torch's C++ makes it."""
        t, wanted = args[0], (args[1] if len(args) > 1 else kwargs.get("dtype"))
        fake = t.device.type == "meta" and not wrapper_subclass(type(t))
        if wanted is None:
            return (legacy_types.name_of(self._type(t), t.dtype) or func(*args, **kwargs)) if fake else func(*args, **kwargs)
        found = legacy_types.target(wanted)
        if found is None or (not fake and found[0] == "cpu"):
            return func(*args, **kwargs)
        device, dtype = found
        if self._type(t) == device and t.dtype == dtype:
            return t
        blocking = kwargs.get("non_blocking", args[2] if len(args) > 2 else False)
        return self._to(torch.Tensor.to, (t,), {"device": device, "dtype": dtype, "non_blocking": blocking})

    def _default_device(self) -> str:
        """Where a factory with no device puts its tensor: CUDA after set_default_tensor_type with a
        CUDA type, or under set_default_device("cuda") / `with torch.device("cuda")` (torch keeps
        their DeviceContext at the bottom of the mode stack, below this mode), else the CPU."""
        if self.session.default_cuda():
            return "cuda"
        from torch.overrides import _get_current_function_mode_stack
        from torch.utils._device import DeviceContext

        for mode in reversed(_get_current_function_mode_stack()):
            if isinstance(mode, DeviceContext):
                return "cuda" if mode.device.type == "cuda" else "cpu"
        return "cpu"

    def _factory(self, func, args, kwargs):
        name = getattr(func, "__name__", "factory")
        if name in _FROM_DATA and args and isinstance(args[0], (list, tuple)):
            args = (self._read_elements(args[0]),) + tuple(args[1:])
        self._check_ordinal(_cuda_ordinal(kwargs.get("device")))
        device = device_type(kwargs.get("device")) or self._default_device()
        kwargs = dict(kwargs)
        pin = bool(kwargs.pop("pin_memory", False)) and device == "cpu"
        if pin:
            notes_mod.record(notes_mod.STAND_IN, "pinned host memory (pin_memory=True): ordinary host memory")
        if device == "meta" and spoofing():   # meta asked for by code that sees fake tensors as CUDA: a meta
            # tensor, as torch makes it (no memory anywhere); where fake tensors show meta (unspoofed), meta is theirs
            with OnDevice("meta"):
                out = func(*args, **kwargs)
            if isinstance(out, torch.Tensor) and not wrapper_subclass(type(out)) and self.storages.key_of(out) is None:
                self.storages.see(out, "meta", name)
            return out
        if device == "cpu" or device == "meta":
            out = func(*args, **kwargs)   # the CPU is real: data, indices, bookkeeping; (meta: see above)
            if pin and isinstance(out, torch.Tensor):
                self.session.pinned.add(out)
            return out
        kwargs["device"] = META
        with OnDevice(device):
            out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor) and not wrapper_subclass(type(out)):
            unseen = self.storages.key_of(out) is None
            if unseen:   # torch.tensor(data, device=) reaches no dispatch mode (under inference mode, its detach_ does)
                self.storages.see(out, device, name)
            if (unseen or name in _FROM_DATA) and out.numel() <= known_mod.cap(out.dtype) and self._known(out) is None:
                kwargs["device"] = "cpu"   # nor does the value it holds (known.py)
                self.session.known.remember(out, func(*args, **kwargs))
        # (a DTensor's storage is a global-size stand-in: its local tensor is what was allocated)
        return out

    def _known(self, t):
        """The real value of fake tensor `t` where it is known and not assumed (known.py), else None."""
        known = self.session.known
        with torch._C.DisableTorchFunction():
            return None if known.is_assumed(t) else known.value(t)

    def _check_ordinal(self, index: int | None) -> None:
        """A CUDA index past the devices the process has: torch's error, for the script (on one GPU,
        `torch.ones(3, device="cuda:1")` fails so; the tensor made on cuda:0 hid a script that fails)."""
        count = self.session.device_count
        if index is not None and index >= count:
            raise for_the_script(RuntimeError(INVALID_ORDINAL.format(index=index, count=count,
                                                                     s="s" if count != 1 else "")))

    def _to(self, func, args, kwargs):
        t = args[0]
        target, index, options = _parse_to(func, args, kwargs, self._type)
        self._check_ordinal(index)
        options = {k: v for k, v in options.items() if v is not None}
        source = self._type(t)
        if target is None or (target == "meta" and t.device.type == "meta" and not spoofing()):
            target = source   # "meta" is a fake tensor's real device, as code below the mode sees it
        if target == "cpu" and t.device.type != "meta":
            return torch.Tensor.to(t, **options)            # real stays real
        if target == source:
            return torch.Tensor.to(t, **options)            # no device change: a copy only if asked
        if target == "cpu" and not t.requires_grad:   # (a parameter stays fake: known.py)
            value = self._known(t)
            if value is not None:   # a value the program knows, brought to the host: the real tensor,
                return torch.Tensor.to(value, **{**options, "copy": True})   # as torch gives it (known.py)
        with OnDevice(target):   # a copy across devices: torch copies even when nothing else changes
            return torch.Tensor.to(t, device=META, **{**options, "copy": True})


# Modules whose Python-level torch functions run their bodies under the mode (DeviceMode._open):
# torch.nn.functional and torch.functional, whose bodies call the ops that CUDA's autocast and the
# kernel rules must see. Tensor methods written in Python (torch._tensor: backward, __repr__, ...)
# keep running as they are.
_OPENED_MODULES = {"torch.nn.functional", "torch.functional"}
_NO_OVERRIDE = {name: (lambda *a, **k: False)
                for name in ("has_torch_function", "has_torch_function_unary", "has_torch_function_variadic")}


