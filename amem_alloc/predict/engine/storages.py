"""Where each fake storage comes from and when it dies: the allocations and frees a prediction records.

Design note
-----------
`Storages` keeps, per storage made inside a prediction, its key, device and size. Torch keeps one
Python object per storage while any tensor holds it, so a weak reference to that object reports
the free exactly when the storage dies; a storage grown by `resize_` is a new block (the old one
freed), as CUDA's allocator sees it. A storage asked for its address (`data_ptr()`: programs key
parameters by it, e.g. accelerate maps an optimizer's parameters to their FSDP shards so) gets a
fake device address of its own, distinct from every other live storage's, as a CUDA pointer is.
`user_frames` is the call stack recorded with each allocation:
the user's and libraries' frames, never torch's, amem's or the standard library's, and nothing
beyond amem's script runner (code_files.py's rules), cached per code object since it is asked on
every allocation.
"""
from __future__ import annotations

import functools
import itertools
import sys
import weakref
from typing import Callable

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ...code_files import is_script_runner, is_traced_file
from ..notes import NotModelledError, call_site

_RUNNER, _TRACED, _SKIPPED = 0, 1, 2
_CODE_KIND: dict = {}   # code object -> _RUNNER, _TRACED or _SKIPPED (asked on every allocation)


def _code_kind(code) -> int:
    name = code.co_filename
    kind = _CODE_KIND[code] = _RUNNER if is_script_runner(name) else _TRACED if is_traced_file(name) else _SKIPPED
    return kind


def user_frames(limit: int = 6) -> tuple:
    """(filename, line, function) of the caller's frames outside torch, amem and the standard
    library, innermost first, up to amem's script runner (code_files.py's rules)."""
    out, f, known = [], sys._getframe(1), _CODE_KIND
    while f is not None and len(out) < limit:
        code = f.f_code
        kind = known.get(code)
        if kind is None:
            kind = _code_kind(code)
        if kind == _RUNNER:
            break
        if kind == _TRACED:
            out.append((code.co_filename, f.f_lineno, code.co_name))
        f = f.f_back
    return tuple(out)


FAKE_ADDRESS_BASE = 0x7F00_0000_0000   # where fake device addresses start (a CUDA-like range)
ADDRESS_ALIGN = 512                     # CUDA's allocator aligns every block to 512 bytes


SPARSE = ("sparse tensors on the GPU ({layout}: one made there or moved there, a sparse buffer of a module moved "
          "with it included, and the gradient of nn.Embedding/EmbeddingBag(sparse=True)): a prediction models dense "
          "tensors only (sparse=False makes that gradient dense)")
_DENSE = (torch.strided, torch._mkldnn)
_SPARSE_MAKERS = ("to_sparse", "sparse_coo_tensor", "sparse_compressed_tensor", "sparse_csr_tensor",
                  "sparse_csc_tensor", "sparse_bsr_tensor", "sparse_bsc_tensor")   # op names, leading _ dropped


_MAKES_SPARSE: dict = {}   # op -> whether it is a sparse constructor or conversion (asked on every CUDA op)


def _makes_sparse(func) -> bool:
    made = _MAKES_SPARSE.get(func)
    if made is None:
        made = _MAKES_SPARSE[func] = func.__name__.split(".")[0].lstrip("_").startswith(_SPARSE_MAKERS)
    return made


def refuse_sparse(func, args_leaves: list, kwargs: dict) -> None:
    """A CUDA op making or taking a sparse tensor is amem's stated limit (fake tensors are dense
    meta storages: a sparse one has none), raised at the user's line before torch fails on it."""
    layouts = [a.layout for a in args_leaves if isinstance(a, torch.Tensor) and a.layout not in _DENSE]
    if kwargs.get("layout") not in (None, *_DENSE):
        layouts.append(kwargs["layout"])
    if not layouts and _makes_sparse(func):
        layouts.append(torch.sparse_coo)   # a sparse constructor or conversion
    if layouts:
        raise _sparse_refused(layouts[0])


def _sparse_refused(layout: torch.layout) -> NotModelledError:
    return NotModelledError(SPARSE.format(layout=str(layout).replace("torch.", "")), call_site(3))


def storage_of(t: torch.Tensor) -> torch.UntypedStorage:
    """The storage behind `t`, through functorch's wrappers (vmap's BatchedTensor, grad's wrapper:
    create_block_mask vmaps the mask function over fake tensors), which have none of their own. A
    fake sparse tensor (a meta one: the user's own are CPU or CUDA) is amem's stated limit."""
    try:
        return t.untyped_storage()
    except NotImplementedError:
        if t.layout not in _DENSE and t.device.type == "meta":
            raise _sparse_refused(t.layout) from None
        while torch._C._functorch.is_functorch_wrapped_tensor(t):
            t = torch._C._functorch.get_unwrapped(t)
        return t.untyped_storage()


def storage_tensors(t) -> list[torch.Tensor]:
    """The plain tensors whose storages hold `t`: itself, or for a wrapper tensor subclass (DTensor's
    local shard, torchao's quantized and float8 weights: int data and scales) the tensors it holds,
    as torch's own `__tensor_flatten__` lists them, recursively. Anything else: none."""
    if not isinstance(t, torch.Tensor):
        return []
    if not is_traceable_wrapper_subclass(t):
        return [t]
    names, _ = t.__tensor_flatten__()
    return [inner for name in names for inner in storage_tensors(getattr(t, name, None))]


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
        self.addresses: dict = {}   # key (or ("host", id) for fake CPU storages) -> fake address, once asked
        self.next_address = FAKE_ADDRESS_BASE

    def device_of(self, t: torch.Tensor) -> str | None:
        """The device `t` claims; None for a tensor subclass with no storage of its own (a
        ShardedTensor: its local shards hold its data and are seen as themselves)."""
        if t.device.type != "meta":
            return t.device.type
        try:
            storage = storage_of(t)
        except RuntimeError as err:
            if isinstance(err, NotModelledError) or type(t) in (torch.Tensor, torch.nn.Parameter):
                raise
            return None
        return self.device_of_storage(storage)

    def device_of_storage(self, st: torch.UntypedStorage) -> str | None:
        """The device a storage made in the session claims ("cuda", "meta", ...), None if not one of them."""
        rec = self.by_id.get(id(st))
        return rec[1] if rec else None

    def holds(self, device: str) -> bool:
        """Whether a live storage is on `device` ("meta": a meta tensor the code itself made)."""
        return any(rec[1] == device for rec in self.by_id.values())

    def key_of(self, t: torch.Tensor) -> int | None:
        return self.key_of_storage(storage_of(t))

    def key_of_storage(self, st: torch.UntypedStorage) -> int | None:
        rec = self.by_id.get(id(st))
        return rec[0] if rec else None

    def address(self, st: torch.UntypedStorage) -> int:
        """A fake storage's address, fixed while it lives: a CUDA block's by its key (a storage
        refilled by resize_ is a new block), a fake CPU one's (a parameter, a tensor brought back
        from the device: meta storages the session does not track) by the storage object."""
        rec = self.by_id.get(id(st))
        if rec is not None and rec[1] == "cuda":
            key = rec[0]
        else:
            key = ("host", id(st))
            if key not in self.addresses:
                weakref.finalize(st, self.addresses.pop, key, None)
        if key not in self.addresses:
            self.addresses[key] = self.next_address
            self.next_address += -(-max(st.nbytes(), 1) // ADDRESS_ALIGN) * ADDRESS_ALIGN
        return self.addresses[key]

    def see(self, t: torch.Tensor, device: str, op: str) -> None:
        st = t.untyped_storage()
        sid, nbytes = id(st), st.nbytes()
        rec = self.by_id.get(sid)
        if rec is not None:
            if nbytes <= rec[2]:
                return
            self._died(sid, rec[0], rec[1])   # resize_ grew it: torch allocates a new block and frees the old
        key, device = self._new(sid, device, nbytes, op, t)
        self._watch(st, sid, key, device)

    def _watch(self, st: torch.UntypedStorage, sid: int, key: int, device: str) -> None:
        """The weak reference that reports the storage's free when torch drops it."""
        self.refs[sid] = weakref.ref(st, functools.partial(self._on_collected, sid, key, device))

    def _on_collected(self, sid: int, key: int, device: str, _ref: weakref.ref) -> None:
        self._died(sid, key, device)

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
            self.addresses.pop(key, None)
            if device == "cuda" and rec[2] > 0:
                self.on_free(key)

    def resized(self, st, nbytes: int) -> None:
        """UntypedStorage.resize_ on a fake storage (FSDP frees and refills its unsharded parameters
        so, outside any op): to 0 the block is freed, to a larger size a new block is allocated."""
        rec = self.by_id.get(id(st))
        if rec is None or nbytes == rec[2]:
            return
        key, device, old = rec
        self.addresses.pop(key, None)   # a refilled storage is a new block, at a new address
        if old > 0 and device == "cuda":
            self.on_free(key)
        self.by_id[id(st)] = (key, device, 0)
        if nbytes > 0:
            new = self.next_key()
            self.by_id[id(st)] = (new, device, nbytes)
            self._watch(st, id(st), new, device)
            if device == "cuda":
                self.on_alloc(new, nbytes, "resize_", None)

    def alloc_extra(self, nbytes: int, op: str) -> int:
        """An allocation a CUDA kernel or library makes that no tensor shows (a workspace)."""
        key = self.next_key()
        self.on_alloc(key, nbytes, op, None)
        return key


# The code that runs inside the weak-reference callback reporting a free (and what it calls in this
# file): an exception raised there is printed and dropped by Python, never reaching the script
# (script.py's deadline waits for its next tick when it lands here).
FREE_CALLBACK_CODES = frozenset({Storages._on_collected.__code__, Storages._died.__code__})
