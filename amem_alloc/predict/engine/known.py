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
  value; where one is unknown the real tensor keeps what it held, noted as a read is. A real tensor
  cannot become unknown (the program reads it without asking torch), and zeros written into it
  broke a library's own bookkeeping: DDP's reducer copies its bucket indices back from the device
  into a CPU tensor, and read zeros crashed it (a segfault in backward).

A known value brought to the host (`.cpu()`, `.to("cpu")`) is the real host tensor torch would
give, not a fake one (engine/device_mode.py): accelerate sends a generator's state through the
device and back, and `torch.Generator.set_state` takes only a real byte tensor. An assumed value
stays fake there (its reads are noted), and so does a tensor that requires grad (a parameter whose
values a checkpoint gave): `module.cpu()` moves a parameter and its gradient alike only where both
copies are of one kind (torch's `_has_compatible_shallow_copy_type`), and a real copy of the
parameter beside a fake one of its gradient failed its check ("out_param.grad must not be None":
Lightning's teardown after its batch size finder restored its checkpoint).

A stand-in number is an ordinary number once handed out: `losses[k] = loss.item()` writes 0.0
(the stand-in, noted where `.item()` read it) into a known tensor, which stays known, holding it.

The cap keeps the cost small: shadows are index-sized tensors (positions, masks over a batch's
tokens, scalars), never activations or parameters (parameters are always fake, session.py), and
no op is run for real whose output would exceed it. Values computed from unknowable data (model
outputs, gradients, random numbers) stay unknown and their reads get stand-ins. Integer and bool
tensors (indices, masks, counts: what decides sizes and branches) may be larger
(`MAX_INDEX_ELEMENTS`, 4 Mi elements) than floating ones (`MAX_ELEMENTS`, 64 Ki).

Factories that take only a template's shape (`zeros_like`, `new_ones`, `full_like`, ...) are known
whatever the template holds.

Two more things are kept beside the values, for data-dependent sizes (rules/data_dependent.py says
the model; this module only stores and propagates):

* *assumed* values: an op whose inputs are unknown but whose output has a guaranteed structure (a
  router's `topk` indices, a `randperm`) gets a value chosen by the shape rule (`expected` or
  `upper`): a shadow like any other, marked assumed, with its value under the *other* rule beside
  it (`alt`: None where it cannot be told, `SAME` where it is the same). Ops on assumed inputs run
  once per rule, so a size computed from them is known under both (the notes give both), and their
  outputs are assumed too. Reads of assumed values are stand-ins, and noted as such (values.py);
* *counts*: the number of nonzero elements of an unknown mask whose values no shadow holds, where
  the program fixed it (`mask[idx] = 1` on zeros sets len(idx) of them; `a | b`, `cat` add up);
* *distinct values*: at most how many different values an unknown tensor holds, where it was
  picked from a tensor that holds few (`labels[keep]` of class labels made by `arange`): a
  `unique()` of it has at most that many.
"""
from __future__ import annotations

import weakref

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from .. import notes
from ..rules import data_dependent

__all__ = ["KnownValues", "MAX_ELEMENTS", "MAX_INDEX_ELEMENTS", "SAME"]

MAX_ELEMENTS = 1 << 16         # floating tensors: positions, scalars, small constants
MAX_INDEX_ELEMENTS = 1 << 22   # integer and bool tensors: indices, masks, counts (sizes and branches)
MAX_DISTINCT_COUNTED = 1 << 20  # the largest known value whose distinct values are counted (a unique())
SAME = "same"                  # an assumed value that is the same under both shape rules
META, CPU = torch.device("meta"), torch.device("cpu")
_UNINITIALISED = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted",
                  "resize_", "resize_as_", "set_"}
_OVERWRITES = {"copy_", "fill_", "zero_"}   # in-place ops that write every element of their target
_SHAPE_ONLY = {"zeros_like", "ones_like", "full_like", "new_zeros", "new_ones", "new_full"}   # a template's shape only


class _Unknown(Exception):
    pass


class Known(tuple):
    """An op's inputs with each tensor replaced by its real value: (args, kwargs), and `alt`, the
    same under the other shape rule where an input is assumed (None: no input is assumed; UNSEEN:
    some assumed input's value there cannot be told)."""
    alt: object = None


UNSEEN = "unseen"


class KnownValues:
    """id(storage) -> a real CPU buffer (uint8) of the storage's bytes, for small fake storages whose
    values are known. A weak reference to the storage drops the buffer when the storage dies. Beside
    it: which are assumed (and their value under the other shape rule), and counts of nonzero
    elements of unknown masks (the module's note)."""

    def __init__(self):
        self.by_id: dict[int, tuple[weakref.ref, torch.Tensor]] = {}
        self.assumed: dict[int, object] = {}   # id(storage) -> its buffer under the other rule, SAME or None
        self.counts: dict[int, int] = {}       # id(storage) -> nonzero elements of an unknown mask
        self.distinct: dict[int, int] = {}     # id(storage) -> at most this many distinct values (unknown tensor)
        self.integral: set[int] = set()        # id(storage): unknown, but holds integers (floor's output)
        self.awaited: dict[int, int] = {}      # id(storage) -> the rank whose broadcast it holds, unknown here
        self.roots_read: set[int] = set()      # ranks whose unknown broadcast values were read
        self._written: dict = {}   # func -> positions of the arguments it writes
        self._kinds: dict = {}     # func -> _NEVER, _OVERWRITE, _SHAPE or _ORDINARY
        self.saving = 0            # > 0 inside a save (saved_files.py): unknown values written as zeros

    # ------------------------------------------------------------------ single tensors
    def value(self, t: torch.Tensor) -> torch.Tensor | None:
        """The real value of fake tensor `t` (a CPU view of its shadow), or None if unknown."""
        rec = self.by_id.get(id(t.untyped_storage()))
        if rec is None:
            return None
        return _view(rec[1], t)

    def is_assumed(self, t: torch.Tensor) -> bool:
        return id(t.untyped_storage()) in self.assumed

    def other_value(self, t: torch.Tensor) -> torch.Tensor | None:
        """An assumed tensor's value under the other shape rule (None where it cannot be told)."""
        sid = id(t.untyped_storage())
        alt = self.assumed.get(sid)
        if alt is SAME:
            return self.value(t)
        return None if alt is None else _view(alt, t)

    def remember(self, fake: torch.Tensor, real: torch.Tensor) -> None:
        """Fake tensor `fake` (a fresh storage) holds the values of real CPU tensor `real`."""
        if _small(fake) and tuple(real.shape) == tuple(fake.shape):
            buf = self._shadow(fake)
            if buf is not None:
                with torch._C.DisableTorchFunction():
                    _view(buf, fake).copy_(real)

    def assume(self, fake: torch.Tensor, value: torch.Tensor, other: torch.Tensor | None) -> None:
        """Fake tensor `fake` (a fresh storage, values unknown) is taken to hold `value` under the
        session's shape rule and `other` under the other one (None: cannot be told)."""
        self.remember(fake, value)
        sid = id(fake.untyped_storage())
        if sid not in self.by_id:
            return
        if other is not None and tuple(other.shape) == tuple(value.shape) and torch.equal(other, value):
            self.assumed[sid] = SAME
        elif other is not None and tuple(other.shape) == tuple(fake.shape):
            alt = torch.zeros_like(self.by_id[sid][1])
            with torch._C.DisableTorchFunction():
                _view(alt, fake).copy_(other)
            self.assumed[sid] = alt
        else:
            self.assumed[sid] = None

    def count(self, t: torch.Tensor) -> int | None:
        """The number of nonzero elements of fake tensor `t`: from its value, or from a count the
        program fixed (counts), or None."""
        v = self.value(t)
        if v is not None:
            with torch._C.DisableTorchFunction():
                return int(torch.count_nonzero(v))
        if _covers_storage(t):
            return self.counts.get(id(t.untyped_storage()))
        return None

    def set_count(self, t: torch.Tensor, n: int) -> None:
        """Unknown fake tensor `t` (covering its storage) has `n` nonzero elements."""
        if _covers_storage(t) and id(t.untyped_storage()) not in self.by_id:
            st = t.untyped_storage()
            sid = id(st)
            self.counts[sid] = max(0, min(int(n), t.numel()))
            weakref.finalize(st, self.counts.pop, sid, None)

    def distinct_values(self, t: torch.Tensor) -> int | None:
        """At most how many different values fake tensor `t` holds: from its value, or from what
        it was picked from (distinct), or None."""
        v = self.value(t)
        if v is not None:
            if v.numel() > MAX_DISTINCT_COUNTED:
                return None
            with torch._C.DisableTorchFunction():
                return int(torch.unique(v).numel())
        return self.distinct.get(id(t.untyped_storage()))

    def set_distinct(self, t: torch.Tensor, n: int) -> None:
        """Unknown fake tensor `t` holds at most `n` different values (all of its storage's)."""
        st = t.untyped_storage()
        sid = id(st)
        if sid not in self.by_id and n < t.numel():
            if sid not in self.distinct:
                weakref.finalize(st, self.distinct.pop, sid, None)
            self.distinct[sid] = int(n)

    def is_integral(self, t: torch.Tensor) -> bool:
        """Whether fake tensor `t` holds integers: an integer dtype, or floor/ceil/round/trunc's output."""
        return not t.dtype.is_floating_point or id(t.untyped_storage()) in self.integral

    def learn(self, facts: list) -> None:
        """Facts a VALUES rule (rules/data_dependent.py) told of an op's unknown outputs."""
        for fact in facts:
            if fact[0] == "assume":
                self.assume(*fact[1:])
            elif fact[0] == "count":
                self.set_count(*fact[1:])
            elif fact[0] == "distinct":
                self.set_distinct(*fact[1:])
            elif fact[0] == "integral" and fact[1].numel() <= MAX_INDEX_ELEMENTS:
                st = fact[1].untyped_storage()
                self.integral.add(id(st))
                weakref.finalize(st, self.integral.discard, id(st))

    def _shadow(self, t: torch.Tensor) -> torch.Tensor | None:
        st = t.untyped_storage()
        if st.nbytes() == 0:
            return None
        sid = id(st)
        # the device named: a library may wrap torch.zeros to default it to CUDA (DeepSpeed's zero.Init)
        buf = torch.zeros(st.nbytes(), dtype=torch.uint8, device="cpu")
        self.by_id[sid] = (weakref.ref(st, lambda _, sid=sid, buf=buf: self._died(sid, buf)), buf)
        self.assumed.pop(sid, None)
        self.counts.pop(sid, None)
        self.distinct.pop(sid, None)
        self.awaited.pop(sid, None)
        return buf

    def _died(self, sid: int, buf: torch.Tensor) -> None:
        rec = self.by_id.get(sid)
        if rec is not None and rec[1] is buf:
            del self.by_id[sid]
            self.assumed.pop(sid, None)

    def forget(self, t: torch.Tensor) -> None:
        sid = id(t.untyped_storage())
        self.by_id.pop(sid, None)
        self.assumed.pop(sid, None)
        self.counts.pop(sid, None)
        self.distinct.pop(sid, None)

    def await_root(self, t: torch.Tensor, rank: int) -> None:
        """`t` holds what rank `rank` broadcast, unknown in this process (forgotten)."""
        self.forget(t)
        self.awaited[id(t.untyped_storage())] = rank

    def pass_awaited(self, args: tuple, kwargs: dict, out) -> None:
        """An op on unknown values, one of them a broadcast's awaited here: its outputs hold what
        that rank sent too (`t.cpu()`, `t.tolist()` after `t + 0`), so a read of them asks for it.
        (Called for every such op: nothing is walked while nothing is awaited.)"""
        if not self.awaited:
            return
        rank = next((self.awaited[id(a.untyped_storage())] for a in tree_flatten((args, kwargs))[0]
                     if isinstance(a, torch.Tensor) and id(a.untyped_storage()) in self.awaited), None)
        if rank is None:
            return
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and id(t.untyped_storage()) not in self.by_id:
                self.awaited[id(t.untyped_storage())] = rank

    def read_unknown(self, t: torch.Tensor) -> None:
        """An unknown value of `t` was read: where it came from another rank's broadcast, that rank
        is one whose recording first would have told it (distributed/ranks.py)."""
        rank = self.awaited.get(id(t.untyped_storage()))
        if rank is not None:
            self.roots_read.add(rank)

    # ------------------------------------------------------------------ ops
    def inputs(self, func, args: tuple, kwargs: dict, leaves: list):
        """A `Known` (args, kwargs) with each tensor replaced by its real value, or None if any is
        unknown. `leaves` are the op's arguments with lists opened (a quick first look: most ops of a
        model have an unknown input)."""
        kind = self._kinds.get(func)
        if kind is None:
            kind = self._kinds[func] = _kind(func)
        if kind == _NEVER:
            return None
        first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        overwritten = first if kind == _OVERWRITE else None
        template = first if kind == _SHAPE else None
        by_id = self.by_id
        for a in leaves:
            if isinstance(a, torch.Tensor) and a.device.type == "meta" and a is not overwritten \
                    and a is not template and id(a.untyped_storage()) not in by_id:
                return None
        alt = [False]

        def real(a, other: bool):
            if isinstance(a, torch.device) and a.type == "meta":
                return CPU
            if not isinstance(a, torch.Tensor):
                return a
            if a.device.type != "meta":
                if a.numel() > cap(a.dtype):
                    raise _Unknown
                return a
            if a is template and id(a.untyped_storage()) not in by_id:
                return torch.empty_strided(tuple(a.shape), a.stride(), dtype=a.dtype, device="cpu")   # its shape only
            v = self.value(a)
            if v is None and a is overwritten and _small(a) and _covers_storage(a):
                buf = self._shadow(a)   # every element is about to be written
                v = None if buf is None else _view(buf, a)
            if v is None:
                raise _Unknown
            if id(a.untyped_storage()) in self.assumed:
                alt[0] = True
                if other:
                    v = self.other_value(a)
                    if v is None:
                        raise _Unseen
            return v
        try:
            known = Known((tree_map(lambda a: real(a, False), args), tree_map(lambda a: real(a, False), kwargs)))
        except _Unknown:
            return None
        if alt[0]:
            self._split_written(func, args, kwargs)
            try:
                known.alt = (tree_map(lambda a: real(a, True), args), tree_map(lambda a: real(a, True), kwargs))
            except (_Unknown, _Unseen):
                known.alt = UNSEEN
        return known

    def _split_written(self, func, args: tuple, kwargs: dict) -> None:
        """Before an op with assumed inputs runs once per rule: what it writes gets a buffer of its
        own for the other rule (a copy of its value), so the two runs write apart; it is assumed
        from now on."""
        for t in self._written_tensors(func, args, kwargs):
            sid = id(t.untyped_storage())
            rec = self.by_id.get(sid)
            if rec is not None and not isinstance(self.assumed.get(sid), torch.Tensor):
                self.assumed[sid] = rec[1].clone()

    def _written_tensors(self, func, args: tuple, kwargs: dict) -> list:
        """The fake tensors among those `func` writes."""
        return [t for t in self._targets(func, args, kwargs) if t.device.type == "meta"]

    def after(self, func, args: tuple, kwargs: dict, known, out) -> None:
        """Run `func` for real on the known inputs and give `out`'s new storages their values
        (assumed ones, with their values under the other rule, where an input was assumed).
        args, kwargs: the op's own, fake, arguments (what it writes is forgotten among them)."""
        outs, _ = tree_flatten(out)
        fresh = [t for t in outs if isinstance(t, torch.Tensor) and t.device.type == "meta"
                 and id(t.untyped_storage()) not in self.by_id]
        if not all(_small(t) for t in fresh):
            self.written(func, args, kwargs)   # nothing is run: what it writes is unknown
            return
        real = _run(func, known[0], known[1])
        if real is _FAILED:   # no CPU kernel (a CUDA-only op): its outputs, and what it wrote, are unknown
            self.written(func, args, kwargs)
            return
        others = None
        if getattr(known, "alt", None) is not None:
            other = _run(func, *known.alt) if known.alt is not UNSEEN else _FAILED
            others = tree_flatten(other)[0] if other is not _FAILED else [None] * len(outs)
        reals, _ = tree_flatten(real)
        for i, (fake, value) in enumerate(zip(outs, reals)):
            if any(fake is t for t in fresh) and isinstance(value, torch.Tensor):
                if others is None:
                    self.remember(fake, value)
                else:
                    o = others[i] if i < len(others) else None
                    self.assume(fake, value, o if isinstance(o, torch.Tensor) else None)

    def written(self, func, args: tuple, kwargs: dict) -> None:
        """An op whose inputs are not all known: what it writes is unknown from now on."""
        if not (self.by_id or self.counts or self.distinct):
            return
        for t in self._written_tensors(func, args, kwargs):
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
            return v
        with torch._C.DisableTorchFunction():
            real_args, real_kwargs = tree_map(real, args), tree_map(real, kwargs)
            if not stood_in:
                return func(*real_args, **real_kwargs)
            written = list(self._targets(func, args, kwargs))
            if self.saving:   # torch.save's host copy of a fake storage: a fresh buffer, zeros as the docs say
                for t in written:
                    t.zero_()
            else:   # the CPU tensor keeps what it held: a library's own bookkeeping (DDP's reducer copies
                # its bucket indices back from the device) must not read zeros it never wrote
                source = "a CUDA tensor's value" if stood_in[0] == "cuda" else "a value computed on the GPU"
                notes.record(notes.STAND_IN, f"{source} written into a CPU tensor ({func.__name__.partition('.')[0]}): "
                             "the CPU tensor keeps what it held")
            return written[0] if len(written) == 1 else tuple(written)

    def outputs_of(self, func, known, make) -> tuple:
        """A data-dependent shape op (nonzero, boolean indexing, unique) on known inputs: (its fake
        outputs of the real shapes (`make(real_tensor) -> fake`) that know their values, the real
        outputs under the other shape rule where an input was assumed: None where none was,
        UNSEEN where they cannot be told)."""
        real = _run(func, known[0], known[1], fail=False)
        reals, spec = tree_flatten(real)
        fakes = [make(r) if isinstance(r, torch.Tensor) else r for r in reals]
        alt = getattr(known, "alt", None)
        other = None
        if alt is not None:
            other = _run(func, *alt) if alt is not UNSEEN else _FAILED
            other = UNSEEN if other is _FAILED else other
        others = tree_flatten(other)[0] if other not in (None, UNSEEN) else None
        for i, (fake, value) in enumerate(zip(fakes, reals)):
            if not isinstance(fake, torch.Tensor):
                continue
            if alt is None:
                self.remember(fake, value)
            else:
                o = others[i] if others is not None and i < len(others) else None
                self.assume(fake, value, o if isinstance(o, torch.Tensor) else None)
        return tree_unflatten(fakes, spec), other


_FAILED = object()


class _Unseen(Exception):
    pass


def _run(func, args, kwargs, fail: bool = True):
    """func run for real on CPU values (an op the CPU refuses that CUDA runs, by its equivalent in
    rules/data_dependent.py); _FAILED where it raises (with `fail`), else the error goes on."""
    try:
        with torch._C.DisableTorchFunction():
            return data_dependent.CPU_KERNELS.get(func, func)(*args, **kwargs)
    except Exception:
        if not fail:
            raise
        return _FAILED


def cap(dtype: torch.dtype) -> int:
    """The most elements a shadow of this dtype may have."""
    return MAX_ELEMENTS if dtype.is_floating_point or dtype.is_complex else MAX_INDEX_ELEMENTS


_NEVER, _OVERWRITE, _SHAPE, _ORDINARY = "never", "overwrite", "shape", "ordinary"


def _kind(func) -> str:
    name = func.__name__.partition(".")[0]
    if name in _UNINITIALISED or torch.Tag.nondeterministic_seeded in func.tags:
        return _NEVER
    if name in _SHAPE_ONLY:
        return _SHAPE
    return _OVERWRITE if name in _OVERWRITES else _ORDINARY


def _small(t: torch.Tensor) -> bool:
    return t.untyped_storage().nbytes() <= cap(t.dtype) * max(t.element_size(), 1)


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
    """Positions (int) or keyword names (str, for keyword-only ones) of the arguments `func` writes.
    `set_` writes none: it rebinds its tensor to a storage, whose values stay (torch.load builds each
    tensor of a checkpoint so, on the storage map_location moved to CUDA)."""
    if func.__name__.partition(".")[0] == "set_":
        return ()
    out = []
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            out.append(a.name if a.kwarg_only else i)
    return tuple(out)
