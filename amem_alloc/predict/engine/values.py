"""Reading a value from a fake tensor: the stand-in rule, and shapes that depend on values.

Design note
-----------
A prediction computes no values: a fake CUDA tensor (and a fake CPU tensor made from one, such as
`loss.cpu()`) holds none. Ordinary programs read values all the time — they print the loss, log
it, drive a progress bar, let GradScaler check for infs, clip gradients — and none of that changes
what CUDA allocates. So a read gets a stand-in and the run goes on:

* a number (`item()`, `float()`, `int()`, `bool()`, `if t:`, a formatted loss) is zero of the
  tensor's kind: 0.0, 0 or False. Zero is finite, so GradScaler finds no inf and takes every
  step, `clip_grad_norm_(error_if_nonfinite=True)` passes, and a "stop if the loss is nan" test
  does not stop (a check that *every* element holds, `all()`, is true instead: an assumed value,
  rules/data_dependent.py);
* an array (`numpy()`, `tolist()`, `np.asarray(t)`) is zeros of the tensor's shape;
* text (`print(t)`, `repr`, `str`) says that the tensor holds no value, with its device, shape and
  dtype.

Every stand-in is a note (notes.py): the user's file and line, how often, and what was read. With
`strict` (`amem predict --strict`) the first read stops the prediction instead
(DataDependentError, one line naming the user's file and line), except a read torch's own code
makes, which the user cannot take out of the step (TORCHS_OWN_READS: GradScaler's check for an
inf, answered 0: none found, the step taken).

Where an output's *shape* depends on values (`nonzero`, `torch.where(cond)`, boolean-mask
indexing, `masked_select`, `unique`), rules/data_dependent.py says what the program fixes and, for
the rest, what the shape rule (`--shapes expected|upper`, options.py) takes: sizes from counts the
program set, from assumed values (a router's balanced choice), or the upper bound — every element
selected, every element distinct — each a note ("assumed" or "upper-bound") with the figures under
both rules where they differ. Ops with no upper bound (`bincount` without `minlength`,
`repeat_interleave` with a tensor of repeats) stop with DataDependentError.

A stand-in can end the script where a GPU's value would not: the script divides by a count or a
time it read (`loss.item() / valid`, `1.0 / norm`). Such an error — a ZeroDivisionError, or
`math.log(0)`'s "math domain error" — raised after zero stand-ins were given is amem's limit, not
the script's failure (`failure_from_zero`): the line names the error and the last zero stand-ins
read before it, with how to go on. After optimizer steps, the steps made stand (script.py): the
prediction covers them and says where and why the script stopped; before any, the run cannot be
predicted.

Likewise an error raised in the library code that was handed another stand-in — what an object
collective gathered, this rank's own objects for every rank (distributed/object_collectives.py),
which FSDP1's optimizer state dict and a distributed checkpoint's save merge and check — is that
stand-in's consequence (`handed_to` keeps the innermost library frames it was handed to; an error
raised in one of them while it runs is not the script's).

A value read from *assumed* values (known.py: an `if` on a router's choice, `counts.tolist()`)
answers the rule's value and is an "assumed" note with what each rule gave: the notes say which
branch each such stand-in chose. A zero stand-in read by `bool()` is noted "False" (`if t:` is not
taken, `if not t:` is). A check for a nan or an inf is answered from assumed values
(rules/data_dependent.py: the values are numbers), not from a zero.
"""
from __future__ import annotations

import sys

import numpy as np
import torch

from .. import failures, notes
from ..notes import NotModelledError
from ..rules import data_dependent
from ..stopped import STOPPED
from .devices import cuda_index
from .known import UNSEEN

META = torch.device("meta")


class DataDependentError(RuntimeError):
    """User code needed a tensor's value (under --strict), or a shape with no upper bound."""

    def __init__(self, what: str, where: str = ""):
        self.what, self.where = what, where
        self.filename, _, line = where.partition(" ")[0].rpartition(":") if where else ("", "", "")
        self.lineno = int(line) if line.isdigit() else None
        prefix = f"{where}: " if where else ""
        super().__init__(f"{prefix}{what} needs a tensor's value, which prediction does not compute "
                         "(no data is computed); remove it from the predicted step, guard it with "
                         "amem_alloc.predict.is_predicting(), or run without --strict to use a stand-in")


def is_fake(t) -> bool:
    """Whether `t` is a fake tensor of the session (a meta tensor, whatever device it claims)."""
    with torch._C.DisableTorchFunction():
        return isinstance(t, torch.Tensor) and t.device.type == "meta"


def zero_of(dtype: torch.dtype):
    if dtype == torch.bool:
        return False
    if dtype.is_complex:
        return 0j
    return 0.0 if dtype.is_floating_point else 0


_NUMPY = {torch.bfloat16: np.float32, torch.float16: np.float16, torch.float32: np.float32,
          torch.float64: np.float64, torch.bool: np.bool_, torch.uint8: np.uint8, torch.int8: np.int8,
          torch.int16: np.int16, torch.int32: np.int32, torch.int64: np.int64,
          torch.complex64: np.complex64, torch.complex128: np.complex128}


def _describe(t, device: str) -> str:
    with torch._C.DisableTorchFunction():
        shape, dtype = tuple(t.shape), str(t.dtype)
    dev = f"cuda:{cuda_index()}" if device == "cuda" else device   # the rank's own device, as its tensors claim
    return f"tensor(<no value: predicted>, device='{dev}', size={shape}, dtype={dtype})"


# ============================================================================ reads of values
_NUMBER_READS = {"item", "__float__", "__int__", "__bool__", "__index__", "__complex__", "__nonzero__"}
_ARRAY_READS = {"numpy", "__array__", "tolist"}
_TEXT_READS = {"__repr__", "__str__", "__format__"}
READS = _NUMBER_READS | _ARRAY_READS | _TEXT_READS | {"__dlpack__"}


def _read_name(name: str) -> str:
    return {"__float__": "float()", "__int__": "int()", "__bool__": "bool() (an `if` on a tensor)",
            "__index__": "an index from a tensor", "__complex__": "complex()", "__nonzero__": "bool()",
            "__array__": "numpy.asarray()", "__repr__": "repr()/print()", "__str__": "str()/print()",
            "__format__": "a formatted value (f-string)"}.get(name, f"{name}()")


def read(name: str, t, args: tuple, kwargs: dict, device: str, strict: bool, known_values=None,
         shape_rule: str | None = None):
    """The stand-in for a value read `name` of fake tensor `t` (whose claimed device is `device`);
    where its value is known (`known_values`, known.py), the value itself (noted, with what the
    other rule gives, where the value is assumed)."""
    known = known_values.value(t) if known_values is not None else None
    what = f"{_read_name(name)} of a {({'cuda': 'CUDA', 'cpu': 'CPU'}).get(device, 'fake')} tensor"
    if known is not None and (name in _NUMBER_READS or name in _ARRAY_READS
                              or (name == "__format__" and known.dim() == 0)):
        got = _read_known(name, known, args, kwargs)
        if known_values.is_assumed(t):
            other = known_values.other_value(t)
            alt = _read_known(name, other, args, kwargs) if other is not None else None
            _note_assumed(f"{what}, from assumed values", got, alt, shape_rule)
        return got
    where = notes.call_site()
    if known_values is not None:
        known_values.read_unknown(t)
    if (strict and _strict_applies(where)) or name == "__dlpack__":
        raise DataDependentError(what, where)
    with torch._C.DisableTorchFunction():
        dtype, shape = t.dtype, tuple(t.shape)
    zero = zero_of(dtype)
    if name in _NUMBER_READS:
        notes.record(notes.STAND_IN, f"{what}: {zero!r}", where=where)
        value = zero
        if name == "__index__" or name == "__int__":
            return int(value.real if isinstance(value, complex) else value)
        if name == "__float__":
            return float(value.real if isinstance(value, complex) else value)
        if name in ("__bool__", "__nonzero__"):
            return bool(value)
        return value
    if name in _ARRAY_READS:
        notes.record(notes.STAND_IN, f"{what}: zeros", where=where)
        arr = np.zeros(shape, dtype=_NUMPY.get(dtype, np.float32))
        if name == "__array__" and args[1:2] and args[1] is not None:
            arr = arr.astype(args[1])
        return arr.tolist() if name == "tolist" else arr
    notes.record(notes.STAND_IN, f"{what}: text without a value", where=where)
    if name == "__format__":
        spec = args[1] if len(args) > 1 else ""
        return format(zero, spec) if not shape and spec else _describe(t, device)
    return _describe(t, device)


CALLERS_KEPT = 3   # the innermost library frames a stand-in object is handed to (handed_to)


def handed_to(what: str) -> None:
    """A stand-in object (what an object collective gathered: this rank's own, for every rank)
    handed to the library code running now: an error raised in one of its innermost frames, while
    they run, is that stand-in's consequence (failure_from_stand_in)."""
    from .. import state

    st = state.current()
    if st is None:
        return
    frames, f = [], sys._getframe(1)
    while f is not None and len(frames) < CALLERS_KEPT:
        if failures.is_library_line(f.f_code.co_filename):
            frames.append((id(f), f.f_code))   # not the frame: it would keep its locals (tensors) alive
        f = f.f_back
    st.stand_in_callers.append((what, frames))


def failure_from_stand_in(err: BaseException, base: str | None):
    """The NotModelledError that `err`, ending the script, is where a stand-in caused it (see the
    note: arithmetic on a zero; an error in the library code a stand-in object was handed to),
    else None. `base`: the script's folder, for the line's paths. Its `after_stand_in` is True: what
    ran before it was predicted as on the GPU (script.py keeps the steps made by then)."""
    failure = failure_from_zero(err, base) or _failure_from_handed(err, base)
    if failure is not None:
        failure.after_stand_in = True
    return failure


def _failure_from_handed(err: BaseException, base: str | None):
    from .. import state

    st = state.current()
    if st is None or not st.stand_in_callers or isinstance(err, (*STOPPED, SystemExit)):
        return None   # (DCP's CheckpointException is a BaseException)
    raised_in = {(id(frame), frame.f_code) for frame, _ in _raised_through(err)}
    for what, frames in reversed(st.stand_in_callers):
        if any(f in raised_in for f in frames):
            message = (f"{failures.what(err)}, raised where torch used {what}: a prediction records each rank "
                       "apart, so it has no other rank's objects")
            return NotModelledError(message, where=notes.displayed(_raised_at(err), base))
    return None


ZEROS_SHOWN = 3   # the last zero stand-ins before the error, named in its line
ZERO_STAND_INS = tuple(f": {z!r}" for z in (0, 0.0, False, 0j)) + (": zeros",)   # how the notes above end


def failure_from_zero(err: BaseException, base: str | None):
    """The NotModelledError that `err`, ending the script, is where it is arithmetic on a zero
    stand-in (see the note), else None. `base`: the script's folder, for the line's paths."""
    arithmetic = isinstance(err, ZeroDivisionError) or (isinstance(err, ValueError) and str(err) == "math domain error")
    given = notes.current()
    zeros = [n for n in (given or []) if n.kind == notes.STAND_IN and n.what.endswith(ZERO_STAND_INS)]
    if not arithmetic or not zeros:
        return None
    shown = [f"{n.what} at {notes.displayed(n.where, base)}" for n in zeros[-ZEROS_SHOWN:]]
    more = f"; {len(zeros) - ZEROS_SHOWN} more in the notes" if len(zeros) > ZEROS_SHOWN else ""
    message = (f"{type(err).__name__}: {err}, computed from values prediction does not compute, read as zero "
               f"({'; '.join(shown)}{more}); guard those reads or what uses them with "
               "amem_alloc.predict.is_predicting()")
    return NotModelledError(message, where=notes.displayed(_raised_at(err), base))


def _raised_through(err: BaseException):
    """(frame, line) of each entry of `err`'s traceback, outermost first."""
    tb = err.__traceback__
    while tb is not None:
        yield tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next


def _raised_at(err: BaseException) -> str:
    """call_site()'s text for where `err` was raised."""
    frames = [(frame.f_code.co_filename, line, frame.f_code.co_name) for frame, line in _raised_through(err)]
    return notes.frames_site(tuple(reversed(frames)))


_SCALAR_READS = {"_local_scalar_dense": "a tensor's value (item)", "is_nonzero": "bool() of a tensor",
                 "equal": "torch.equal", "allclose": "torch.allclose"}
# comparisons of whole tensors that hold where the program works (an assert, a test of a copy): true,
# as `all()` of unknown values is (data_dependent.py); allclose's own kernel reads a value it cannot have
_HOLDS = {"equal", "allclose"}


def reads_values(func, args: tuple, kwargs: dict) -> bool:
    """Whether aten op `func` returns a value or a shape that depends on its inputs' values."""
    return func.__name__.split(".")[0] in _SCALAR_READS or data_dependent.is_data_dependent(func, args, kwargs)


def _note_assumed(what: str, got, other, shape_rule: str | None, unit: str = "") -> None:
    """An assumed note: `got` under the session's shape rule, `other` (None: not known) under the other."""
    rule = shape_rule or data_dependent.EXPECTED
    where = notes.call_site()
    notes.record(notes.ASSUMED, what, where=where, seen={rule: _plain(got), data_dependent.other(rule): _plain(other)},
                 unit=unit)


def _plain(v):
    """A read's answer as a note keeps it: a number or bool as it is, anything larger by its length."""
    if isinstance(v, (bool, int, float)) or v is None:
        return v
    if isinstance(v, (list, tuple)) and len(v) <= 16:
        return repr(v)
    return f"{len(v)} values" if hasattr(v, "__len__") else repr(v)


def note_known_size(func, out, other, shape_rule: str | None) -> None:
    """A data-dependent op (or value read) on known inputs some of which are assumed: its size (or
    value) under the session's rule and under the other (`other`: None where an input there was not
    known), as one note per call site."""
    name = func.__name__.split(".")[0]
    if name in _SCALAR_READS:
        _note_assumed(f"{_SCALAR_READS[name]}, from assumed values", out, None if other is UNSEEN else other,
                      shape_rule)
        return
    rows = _rows(out)
    alt = _rows(other) if other is not None and other is not UNSEEN else None
    _note_assumed(f"{_op_name(func)}(), from assumed values", rows, alt, shape_rule, "rows")


def _rows(out) -> int | None:
    first = out[0] if isinstance(out, (tuple, list)) and out else out
    return int(first.shape[0]) if isinstance(first, torch.Tensor) and first.dim() else None


def _read_known(name: str, known, args: tuple, kwargs: dict):
    with torch._C.DisableTorchFunction():
        if name in ("numpy", "__array__") and known.dtype == torch.bfloat16:
            known = known.float()
        return getattr(known, name)(*args[1:], **kwargs)


# reads torch makes itself, which the user cannot remove from the predicted step: --strict gives
# them their stand-in too (GradScaler's check for an inf: 0, none found, the step taken)
TORCHS_OWN_READS = ("torch/amp/grad_scaler.py:", "torch/cuda/amp/grad_scaler.py:")


def _strict_applies(where: str) -> bool:
    """Whether --strict stops at a read made at `where` (call_site's text): not at torch's own."""
    library = where.partition(" (via ")[2]
    return not library.startswith(TORCHS_OWN_READS)


def scalar_op(func, args: tuple, strict: bool):
    """Dispatch-level reads that return a Python value (`_local_scalar_dense`, `is_nonzero`,
    `equal`, `allclose`): the zero stand-in (True for a comparison that holds: `_HOLDS`), or None
    when `func` is none of them."""
    name = func.__name__.split(".")[0]
    if name not in _SCALAR_READS:
        return None
    what = _SCALAR_READS[name]
    where = notes.call_site()
    if strict and _strict_applies(where):
        raise DataDependentError(what, where)
    value = True if name in _HOLDS else False if name != "_local_scalar_dense" else zero_of(args[0].dtype)
    notes.record(notes.STAND_IN, f"{what}: {value!r}", where=where)
    return (value,)


# ============================================================================ shapes from values
def _op_name(func) -> str:
    """aten ops by their bare name ("nonzero"), others with their namespace ("torchvision::nms")."""
    name = func.__name__.split(".")[0]
    namespace = getattr(func, "namespace", "aten")
    return name if namespace == "aten" else f"{namespace}::{name}"


def shape_op(func, args: tuple, kwargs: dict, strict: bool, known_values=None, shape_rule: str | None = None):
    """An op whose output shape depends on values not all known: (output,) as
    rules/data_dependent.py sizes it, or None when `func` is not one. Raises DataDependentError under
    strict, or where no upper bound exists."""
    if not data_dependent.is_data_dependent(func, args, kwargs):
        return None
    sized = data_dependent.sizes(func, args, kwargs, known_values, shape_rule)
    if sized is None:
        return None
    where = notes.call_site()
    if sized is data_dependent.NO_BOUND:
        raise DataDependentError(f"{_op_name(func)}() (its output's size)", where)
    if strict:
        raise DataDependentError(f"{sized.what.split(':')[0]} (its output's size)", where)
    rule = shape_rule or data_dependent.EXPECTED
    notes.record(notes.UPPER_BOUND if sized.upper_bound else notes.ASSUMED, sized.what, where=where,
                 seen={rule: sized.rows, data_dependent.other(rule): sized.rows}, unit="rows")
    return (sized.out,)
