"""Known values: the real values of small fake CUDA tensors that were made from known data.

Design note
-----------
A fake CUDA tensor holds no value, and a read of one gets a stand-in (values.py). But many small
GPU tensors are made from data the program knows: a real CPU tensor moved over (`.to("cuda")`,
`torch.tensor(..., device="cuda")`), `arange`, `full`, `zeros`, `ones`, and deterministic ops on
those (`diff`, `cumsum`, a comparison, `all()`). Libraries branch on them: transformers'
masking_utils tests `(packed[:, -1] == 0).all()` on position ids made by `torch.arange` on the GPU,
and with the zero stand-in it would build an explicit (B, 1, T, T) mask where a GPU run passes
`is_causal` to SDPA. So such a tensor keeps its value in a *shadow*: a real CPU buffer of its
storage's bytes, and a read of it gives the true value, with no stand-in and no note.

Rules, per op the recorder sees (execution.Recorder):

* an op's *inputs are known* when every fake tensor among them has a shadow and every real tensor
  among them is no larger than the cap; factories (no tensor inputs) are known except `empty*`
  (uninitialised memory) and random ops (torch's `nondeterministic_seeded` tag);
  `copy_`, `fill_` and `zero_` overwrite all of their target, which need not be known then;
* an op with known inputs is run for real on the shadows (on the CPU, after its meta run), when
  each new output storage is no larger than the cap (`MAX_ELEMENTS` elements, 65,536): outputs
  get shadows, and in-place ops write into the shadows they were given; views share their base's
  storage, hence its shadow;
* an op with unknown inputs that writes a tensor (in place or `out=`: `losses[k] = loss`,
  `index_put_`, `copy_`, `fill_(t)`, `add_(t)`, into it or into a view of it) drops the shadow of
  the storage it writes: every tensor on that storage, views included, is unknown from then on
  and its reads get stand-ins (GradScaler's `found_inf` after its check);
* an op that fails on the CPU (a CUDA-only kernel) makes its outputs, and what it writes, unknown;
* an op that writes a *real* tensor from fake ones (nanoGPT's `losses[k] = loss` into a CPU tensor
  of losses, `cpu_buffer.copy_(t)`) runs on the CPU with each fake input replaced by its known
  value, or where unknown by zeros of its shape: the stand-in a read of it gets (values.py), noted
  as a read is. A real tensor cannot become unknown (the program reads it without asking torch),
  so it holds what a read of the fake value would have given.

A stand-in number is an ordinary number once handed out: `losses[k] = loss.item()` writes 0.0
(the stand-in, noted where `.item()` read it) into a known tensor, which stays known, holding it.

The cap keeps the cost small: shadows are index-sized tensors (positions, masks over a batch's
tokens, scalars), never activations or parameters (parameters are always fake, session.py), and
no op is run for real whose output would exceed it. Values computed from unknowable data (model
outputs, gradients, random numbers) stay unknown and their reads get stand-ins.
"""
from __future__ import annotations

import weakref

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from .. import notes

__all__ = ["KnownValues", "MAX_ELEMENTS"]

MAX_ELEMENTS = 1 << 16
META, CPU = torch.device("meta"), torch.device("cpu")
_UNINITIALISED = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted",
                  "resize_", "resize_as_", "set_"}
_OVERWRITES = {"copy_", "fill_", "zero_"}   # in-place ops that write every element of their target


class _Unknown(Exception):
    pass


class KnownValues:
    """id(storage) -> a real CPU buffer (uint8) of the storage's bytes, for small fake storages whose
    values are known. A weak reference to the storage drops the buffer when the storage dies."""

    def __init__(self):
        self.by_id: dict[int, tuple[weakref.ref, torch.Tensor]] = {}
        self._written: dict = {}   # func -> positions of the arguments it writes
        self._kinds: dict = {}     # func -> _NEVER, _OVERWRITE or _ORDINARY

    # ------------------------------------------------------------------ single tensors
    def value(self, t: torch.Tensor) -> torch.Tensor | None:
        """The real value of fake tensor `t` (a CPU view of its shadow), or None if unknown."""
        rec = self.by_id.get(id(t.untyped_storage()))
        if rec is None:
            return None
        return _view(rec[1], t)

    def remember(self, fake: torch.Tensor, real: torch.Tensor) -> None:
        """Fake tensor `fake` (a fresh storage) holds the values of real CPU tensor `real`."""
        if _small(fake) and tuple(real.shape) == tuple(fake.shape):
            buf = self._shadow(fake)
            if buf is not None:
                with torch._C.DisableTorchFunction():
                    _view(buf, fake).copy_(real)

    def _shadow(self, t: torch.Tensor) -> torch.Tensor | None:
        st = t.untyped_storage()
        if st.nbytes() == 0:
            return None
        sid = id(st)
        buf = torch.zeros(st.nbytes(), dtype=torch.uint8)
        self.by_id[sid] = (weakref.ref(st, lambda _, sid=sid, buf=buf: self._died(sid, buf)), buf)
        return buf

    def _died(self, sid: int, buf: torch.Tensor) -> None:
        rec = self.by_id.get(sid)
        if rec is not None and rec[1] is buf:
            del self.by_id[sid]

    def forget(self, t: torch.Tensor) -> None:
        self.by_id.pop(id(t.untyped_storage()), None)

    # ------------------------------------------------------------------ ops
    def inputs(self, func, args: tuple, kwargs: dict, leaves: list):
        """(args, kwargs) with each tensor replaced by its real value, or None if any is unknown.
        `leaves` are the op's arguments with lists opened (a quick first look: most ops of a
        model have an unknown input)."""
        kind = self._kinds.get(func)
        if kind is None:
            kind = self._kinds[func] = _kind(func)
        if kind == _NEVER:
            return None
        overwritten = args[0] if kind == _OVERWRITE and args and isinstance(args[0], torch.Tensor) else None
        by_id = self.by_id
        for a in leaves:
            if isinstance(a, torch.Tensor) and a.device.type == "meta" and a is not overwritten \
                    and id(a.untyped_storage()) not in by_id:
                return None

        def real(a):
            if isinstance(a, torch.device) and a.type == "meta":
                return CPU
            if not isinstance(a, torch.Tensor):
                return a
            if a.device.type != "meta":
                if a.numel() > MAX_ELEMENTS:
                    raise _Unknown
                return a
            v = self.value(a)
            if v is None and a is overwritten and _small(a) and _covers_storage(a):
                buf = self._shadow(a)   # every element is about to be written
                v = None if buf is None else _view(buf, a)
            if v is None:
                raise _Unknown
            return v
        try:
            return tree_map(real, args), tree_map(real, kwargs)
        except _Unknown:
            return None

    def after(self, func, args: tuple, kwargs: dict, known, out) -> None:
        """Run `func` for real on the known inputs and give `out`'s new storages their values
        (args, kwargs: the op's own, fake, arguments)."""
        outs, _ = tree_flatten(out)
        fresh = [t for t in outs if isinstance(t, torch.Tensor) and t.device.type == "meta"
                 and id(t.untyped_storage()) not in self.by_id]
        if not all(_small(t) for t in fresh):
            self.written(func, args, kwargs)   # nothing is run: what it writes is unknown
            return
        try:
            with torch._C.DisableTorchFunction():
                real = func(*known[0], **known[1])
        except Exception:   # no CPU kernel (a CUDA-only op): its outputs, and what it wrote, are unknown
            self.written(func, args, kwargs)
            return
        reals, _ = tree_flatten(real)
        for fake, value in zip(outs, reals):
            if any(fake is t for t in fresh) and isinstance(value, torch.Tensor):
                self.remember(fake, value)

    def written(self, func, args: tuple, kwargs: dict) -> None:
        """An op whose inputs are not all known: what it writes is unknown from now on."""
        if self.by_id:
            for t in self._targets(func, args, kwargs):
                if t.device.type == "meta":
                    self.forget(t)

    def _targets(self, func, args: tuple, kwargs: dict):
        """The tensors among `func`'s arguments that it writes (in place, `out=`)."""
        positions = self._written.get(func)
        if positions is None:
            positions = self._written[func] = _written_arguments(func)
        for pos in positions:
            a = args[pos] if isinstance(pos, int) and pos < len(args) else kwargs.get(pos) if isinstance(pos, str) else None
            yield from (t for t in (a if isinstance(a, (list, tuple)) else (a,)) if isinstance(t, torch.Tensor))

    # ------------------------------------------------------------------ real tensors written from fake ones
    def writes_real(self, func, args: tuple, kwargs: dict) -> bool:
        """Whether `func` writes a real (CPU) tensor among its arguments."""
        return any(t.device.type != "meta" for t in self._targets(func, args, kwargs))

    def into_real(self, func, args: tuple, kwargs: dict, device_of) -> object:
        """Runs `func`, which writes a real tensor, on the CPU: each fake input replaced by its known
        value, or by zeros of its shape (a stand-in, noted) where unknown. device_of(t): the device
        a fake tensor claims, for the note."""
        stood_in: list[str] = []

        def real(a):
            if not (isinstance(a, torch.Tensor) and a.device.type == "meta"):
                return a
            v = self.value(a)
            if v is None:
                stood_in.append(device_of(a) or "fake")
                v = torch.zeros((), dtype=a.dtype).expand(a.shape)   # no memory, whatever its size
            return v
        with torch._C.DisableTorchFunction():
            args, kwargs = tree_map(real, args), tree_map(real, kwargs)
            if stood_in:
                source = "a CUDA tensor's value" if stood_in[0] == "cuda" else "a value computed on the GPU"
                notes.record(notes.STAND_IN, f"{source} written into a CPU tensor ({func.__name__.partition('.')[0]}): "
                             "zeros")
            return func(*args, **kwargs)

    def outputs_of(self, func, known, make) -> object:
        """A data-dependent shape op (nonzero, boolean indexing, unique) on known inputs: its real
        output, and fake outputs of the real shapes (`make(real_tensor) -> fake`) that know it."""
        with torch._C.DisableTorchFunction():
            real = func(*known[0], **known[1])
        reals, spec = tree_flatten(real)
        fakes = [make(r) if isinstance(r, torch.Tensor) else r for r in reals]
        for fake, value in zip(fakes, reals):
            if isinstance(fake, torch.Tensor):
                self.remember(fake, value)
        return tree_unflatten(fakes, spec)


_NEVER, _OVERWRITE, _ORDINARY = "never", "overwrite", "ordinary"


def _kind(func) -> str:
    name = func.__name__.partition(".")[0]
    if name in _UNINITIALISED or torch.Tag.nondeterministic_seeded in func.tags:
        return _NEVER
    return _OVERWRITE if name in _OVERWRITES else _ORDINARY


def _small(t: torch.Tensor) -> bool:
    return t.untyped_storage().nbytes() <= MAX_ELEMENTS * max(t.element_size(), 1)


def _covers_storage(t: torch.Tensor) -> bool:
    return t.storage_offset() == 0 and t.is_contiguous() and t.numel() * t.element_size() == t.untyped_storage().nbytes()


def _view(buf: torch.Tensor, t: torch.Tensor) -> torch.Tensor | None:
    """`t`'s elements in shadow buffer `buf` (a real CPU view), or None where they do not fit."""
    size = t.element_size()
    if buf.numel() % size:
        return None
    extent = t.storage_offset() + 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) if t.numel() else 0
    if extent * size > buf.numel():
        return None
    with torch._C.DisableTorchFunction():
        return torch.as_strided(buf.view(t.dtype), tuple(t.shape), t.stride(), t.storage_offset())


def _written_arguments(func) -> tuple:
    """Positions (int) or keyword names (str, for keyword-only ones) of the arguments `func` writes."""
    out = []
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            out.append(a.name if a.kwarg_only else i)
    return tuple(out)
