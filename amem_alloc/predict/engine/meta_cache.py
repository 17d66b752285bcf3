"""Output metadata of functional ops by input metadata, so a model's repeated layers run each
meta kernel once per input signature (the Recorder's cache)."""
from __future__ import annotations

import torch

from .devices import META


class MetaCache:
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
    """(is a tuple, [(shape, stride, dtype)]) of fresh dense meta outputs, or None (not cacheable:
    an op on a meta tensor that asks for a host output, `empty_like(t, device="cpu")`, makes a
    real one, which _make cannot)."""
    tensors = [out] if isinstance(out, torch.Tensor) else list(out) if isinstance(out, (tuple, list)) else None
    if tensors is None or not all(isinstance(t, torch.Tensor) for t in tensors):
        return None
    descs = []
    for t in tensors:
        if t.device.type != "meta" or t.storage_offset() != 0 or t.untyped_storage().nbytes() != _extent(t):
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
