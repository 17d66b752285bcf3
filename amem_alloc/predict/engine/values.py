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
  does not stop;
* an array (`numpy()`, `tolist()`, `np.asarray(t)`) is zeros of the tensor's shape;
* text (`print(t)`, `repr`, `str`) says that the tensor holds no value, with its device, shape and
  dtype.

Every stand-in is a note (notes.py): the user's file and line, how often, and what was read. With
`strict` (`amem predict --strict`) the first read stops the prediction instead
(DataDependentError, one line naming the user's file and line).

Where an output's *shape* depends on values (`nonzero`, `torch.where(cond)`, boolean-mask
indexing, `masked_select`, `unique`), the output takes its upper bound — every element selected,
every element distinct — so the prediction does not under-count; each is an "upper-bound" note.
Ops with no upper bound (`bincount`, `repeat_interleave` with a tensor of repeats) stop with
DataDependentError.
"""
from __future__ import annotations

import numpy as np
import torch

from .. import notes

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
    dev = "cuda:0" if device == "cuda" else device
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


def read(name: str, t, args: tuple, kwargs: dict, device: str, strict: bool, known=None):
    """The stand-in for a value read `name` of fake tensor `t` (whose claimed device is `device`);
    where its value is known (`known`, its real CPU value: known.py), the value itself."""
    if known is not None and (name in _NUMBER_READS or name in _ARRAY_READS
                              or (name == "__format__" and known.dim() == 0)):
        return _read_known(name, known, args, kwargs)
    what = f"{_read_name(name)} of a {({'cuda': 'CUDA', 'cpu': 'CPU'}).get(device, 'fake')} tensor"
    where = notes.call_site()
    if strict or name == "__dlpack__":
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


_SCALAR_READS = {"_local_scalar_dense": "a tensor's value (item)", "is_nonzero": "bool() of a tensor",
                 "equal": "torch.equal"}


def reads_values(func, args: tuple) -> bool:
    """Whether aten op `func` returns a value or a shape that depends on its inputs' values."""
    name = _op_name(func)
    return name in _SCALAR_READS or name in _UPPER_BOUNDS or name in _NO_BOUND or _bool_index(func, args)


def _read_known(name: str, known, args: tuple, kwargs: dict):
    with torch._C.DisableTorchFunction():
        if name in ("numpy", "__array__") and known.dtype == torch.bfloat16:
            known = known.float()
        return getattr(known, name)(*args[1:], **kwargs)


def scalar_op(func, args: tuple, strict: bool):
    """Dispatch-level reads that return a Python value (`_local_scalar_dense`, `is_nonzero`,
    `equal`): the zero stand-in, or None when `func` is none of them."""
    name = func.__name__.split(".")[0]
    if name not in _SCALAR_READS:
        return None
    what = _SCALAR_READS[name]
    where = notes.call_site()
    if strict:
        raise DataDependentError(what, where)
    value = False if name != "_local_scalar_dense" else zero_of(args[0].dtype)
    notes.record(notes.STAND_IN, f"{what}: {value!r}", where=where)
    return (value,)


# ============================================================================ shapes from values
def _empty(shape, dtype):
    return torch.empty(shape, dtype=dtype, device=META)


def _nonzero(x, *_, **__):
    return _empty((x.numel(), x.dim()), torch.long)


def _masked_select(x, mask):
    n = torch.broadcast_shapes(x.shape, mask.shape).numel()
    return _empty((n,), x.dtype)


def _unique2(x, sorted=True, return_inverse=False, return_counts=False):
    n = x.numel()
    return (_empty((n,), x.dtype), _empty(x.shape if return_inverse else (0,), torch.long),
            _empty((n,) if return_counts else (0,), torch.long))


def _unique_consecutive(x, return_inverse=False, return_counts=False, dim=None):
    return _unique2(x, True, return_inverse, return_counts)


def _unique_dim(x, dim, sorted=True, return_inverse=False, return_counts=False):
    n = x.shape[dim]
    return (_empty(x.shape, x.dtype), _empty((n,) if return_inverse else (0,), torch.long),
            _empty((n,) if return_counts else (0,), torch.long))


def _index(x, indices):
    """Boolean masks among the indices become long indices selecting every element (upper bound)."""
    out = []
    for idx in indices:
        if isinstance(idx, torch.Tensor) and idx.dtype in (torch.bool, torch.uint8):
            out.extend(_empty((idx.numel(),), torch.long) for _ in range(idx.dim()))
        else:
            out.append(idx)
    return torch.ops.aten.index.Tensor(x, out)


def _nms(dets, scores, iou_threshold):
    """torchvision's non-maximum suppression keeps at most every box (the indices of those kept)."""
    return _empty((dets.shape[0],), torch.long)


def _op_name(func) -> str:
    """aten ops by their bare name ("nonzero"), others with their namespace ("torchvision::nms")."""
    name = func.__name__.split(".")[0]
    namespace = getattr(func, "namespace", "aten")
    return name if namespace == "aten" else f"{namespace}::{name}"


_UPPER_BOUNDS = {"torchvision::nms": (_nms, "torchvision.ops.nms()"), "nonzero": (_nonzero, "nonzero()"),
                 "masked_select": (_masked_select, "masked_select()"),
                 "_unique2": (_unique2, "unique()"), "unique_consecutive": (_unique_consecutive, "unique_consecutive()"),
                 "unique_dim": (_unique_dim, "unique(dim=)"), "_unique": (lambda x, s=True, inv=False:
                                                                         _unique2(x, s, inv)[:2], "unique()")}
_NO_BOUND = {"bincount", "histc", "repeat_interleave", "nonzero_static"}


def _bool_index(func, args) -> bool:
    return (func.__name__ == "index.Tensor" and len(args) > 1
            and any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1]))


def shape_op(func, args: tuple, kwargs: dict, strict: bool):
    """An op whose output shape depends on values: (output,) at the upper bound, or None when `func`
    is not one. Raises DataDependentError under strict, or where no upper bound exists."""
    name = _op_name(func)
    where = None
    if _bool_index(func, args):
        rule, what = (lambda x, idx: _index(x, idx)), "boolean-mask indexing"
    elif name in _UPPER_BOUNDS:
        rule, what = _UPPER_BOUNDS[name]
    elif name in _NO_BOUND and (name != "repeat_interleave" or _tensor_repeats(args, kwargs)):
        raise DataDependentError(f"{name}() (its output's size)", notes.call_site())
    else:
        return None
    where = notes.call_site()
    if strict:
        raise DataDependentError(f"{what} (its output's size)", where)
    notes.record(notes.UPPER_BOUND, f"{what}: output sized for every element", where=where)
    return (rule(*args, **kwargs),)


def _tensor_repeats(args, kwargs) -> bool:
    """repeat_interleave's output size is known when `repeats` is an int or `output_size` is given."""
    if kwargs.get("output_size") is not None:
        return False
    repeats = args[1] if len(args) > 1 else kwargs.get("repeats", args[0] if len(args) == 1 else None)
    return is_fake(repeats)
