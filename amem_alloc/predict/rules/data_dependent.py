"""Data-dependent sizes: what a program guarantees about sizes that only values decide, and the
shape rule (`--shapes expected|upper`) for what it does not.

Design note
-----------
A prediction computes no values, yet some output sizes depend on them: `nonzero`, one-argument
`torch.where`, boolean-mask indexing, `masked_select`, `unique`, torchvision's `nms`, `bincount`.
Taking each at its own upper bound, alone, over-counts programs that split a set by values: a
mixture-of-experts layer runs every expert on every token, a detector's samplers keep every
proposal. What real data does is not knowable, but most of what decides these sizes is fixed by
the program, and the model keeps what it fixes:

1. **Sizes fixed by arguments are not data dependent** (audit of torch's `dynamic_output_shape`
   ops and amem's own list): `histc` has `bins` values, `topk` k, `nonzero_static` its `size`,
   `repeat_interleave` with `output_size` that size, `one_hot` with `num_classes` that many,
   `bincount` `minlength` when the values are known to be below it. They run as any op.
2. **Known values** (engine/known.py): sizes from values the program made from known data are the
   true sizes.
3. **Assumed values** for outputs whose structure the op guarantees, chosen by the shape rule; ops on
   them then run on the CPU like known values, so what is conserved stays conserved — the rows
   routed to all experts of a layer sum to tokens x k, a sampler's `randperm(n)[:k]` is k, the
   FPN levels of a RoI pooler partition the RoIs — whatever the rule:
     `topk` indices (a router's choice of k of n experts, distinct per row):
        expected: balanced routing, row r takes (r*k + j) mod n, so each expert gets rows*k/n;
        upper:    the most skewed routing in which every expert still gets a row: row r takes
                  0..k-1, except that rows 0..n-k-1 take expert k+r in their last place. k-1
                  experts get every row (the most one expert can get), the total is still rows*k,
                  and every expert is used, as over a training run every expert is (an expert that
                  gets no row gets no gradient, and AdamW makes no state for it);
     `argmax`/`argmin`, `max`/`min` over a dim (a top-1 choice): the same with k = 1;
     `sort`/`argsort` indices, `randperm`: the identity permutation (any permutation sizes alike);
     an integer-valued tensor clamped to a small range [a, b] (an FPN level): expected spread
     evenly over a..b; upper all at a except one element at each other value.
   Each assumed tensor carries its value under the other rule, so the notes give both figures.
4. **Counts**: a mask the program builds by setting n indices of zeros (`mask[idx] = 1`, a
   sampler) has n nonzero elements, and `|` and `cat` of counted masks add up; `nonzero` of it has
   that many rows (under either rule: n is the most it can have and what it has when the indices
   are distinct, as a sampler's are).
5. Anything else takes its **upper bound** — every element selected, every element distinct, every
   box kept — noted; ops with no upper bound (`bincount` without `minlength`, `repeat_interleave`
   with tensor repeats, `one_hot` without `num_classes`) stop the prediction with one line.

The default rule is `expected` (balanced routing, samplers' fixed sizes); `upper` is the worst case
that still respects what the program conserves. Reads of assumed values (an `if` on a router's
choice, `counts.tolist()`) are noted with the value each rule gave, so the notes say which branch
each stand-in chose.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ..options import SHAPE_RULES
from .registry import Stage, aten_op, lookup, rule

EXPECTED, UPPER = SHAPE_RULES
WHY = {EXPECTED: "balanced routing, samplers' fixed sizes", UPPER: "the worst case the program allows"}
NO_BOUND = object()     # a SIZES rule's answer where the size has no upper bound
MAX_RANGE = 64          # the widest integer range a clamp is taken as a level assignment over
META = torch.device("meta")
_INTEGRAL = {"floor", "ceil", "round", "trunc"}   # ops whose outputs hold integers (floating dtype)


def other(shape_rule: str) -> str:
    return UPPER if shape_rule == EXPECTED else EXPECTED


@dataclass
class Sized:
    """A SIZES rule's answer: the output, in words what decided its size, the rows (its
    data-dependent dimension) and whether that is the upper bound (else: fixed by the program)."""
    out: Any
    what: str
    rows: int
    upper_bound: bool


# ============================================================================ entry points
def sizes(func, args: tuple, kwargs: dict, known, shape_rule: str | None):
    """An op whose output size depends on its inputs' values, not all known: Sized, NO_BOUND, or
    None where this op's size does not depend on values (rule 1)."""
    found = lookup(Stage.SIZES, func)
    return None if found is None else found.fn(func, args, kwargs, known, shape_rule)


def is_data_dependent(func, args: tuple, kwargs: dict) -> bool:
    """Whether op `func` with these arguments has an output size only values decide."""
    found = lookup(Stage.SIZES, func)
    if found is None:
        return False
    check = _CHECKS.get(found.fn)
    return check(args, kwargs) if check is not None else True


def values(func, args: tuple, kwargs: dict, out, known, shape_rule: str | None) -> list:
    """After an op whose inputs are not all known: facts about its outputs' values, for known.py
    (("assume", tensor, value, other) and ("count", tensor, n)); none under --strict (no rule)."""
    found = lookup(Stage.VALUES, func)
    if found is None:
        return []
    return found.fn(func, args, kwargs, out, known, shape_rule) or []


# ============================================================================ 1-5: sizes
def _arg(args, kwargs, i, name, default=None):
    return args[i] if len(args) > i else kwargs.get(name, default)


def _empty(shape, dtype):
    return torch.empty(shape, dtype=dtype, device=META)


def _counted(known, t) -> int | None:
    return known.count(t) if known is not None else None


@rule(Stage.SIZES, aten_op("nonzero"), aten_op("argwhere"), source="aten/src/ATen/native/cuda/Nonzero.cu")
def nonzero(func, args, kwargs, known, shape_rule):
    x = args[0]
    n = _counted(known, x)
    if n is not None:
        return Sized(_empty((n, x.dim()), torch.long), "nonzero(): the elements the program set", n, False)
    return Sized(_empty((x.numel(), x.dim()), torch.long), "nonzero(): every element", x.numel(), True)


@rule(Stage.SIZES, aten_op("masked_select"), source="aten/src/ATen/native/cuda/IndexKernel.cu")
def masked_select(func, args, kwargs, known, shape_rule):
    x, mask = args[0], args[1]
    shape = torch.broadcast_shapes(x.shape, mask.shape)
    n = _counted(known, mask) if tuple(mask.shape) == tuple(shape) else None
    if n is not None:
        return Sized(_empty((n,), x.dtype), "masked_select(): the elements the program set", n, False)
    return Sized(_empty((shape.numel(),), x.dtype), "masked_select(): every element", shape.numel(), True)


def _bool_indices(args, kwargs) -> bool:
    return len(args) > 1 and any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
                                 for i in args[1])


@rule(Stage.SIZES, aten_op("index.Tensor"), source="aten/src/ATen/TensorIndexing.h")
def bool_index(func, args, kwargs, known, shape_rule):
    """x[mask]: a boolean mask among the indices selects its nonzero elements (long indices here)."""
    if not _bool_indices(args, kwargs):
        return None
    x, indices = args[0], args[1]
    masks = [i for i in indices if isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)]
    n = _counted(known, masks[0]) if len(masks) == 1 else None
    out, rows = [], 0
    for idx in indices:
        if isinstance(idx, torch.Tensor) and idx.dtype in (torch.bool, torch.uint8):
            rows = idx.numel() if n is None else n
            out.extend(_empty((rows,), torch.long) for _ in range(idx.dim()))
        else:
            out.append(idx)
    what = "boolean-mask indexing: " + ("every element" if n is None else "the elements the program set")
    return Sized(torch.ops.aten.index.Tensor(x, out), what, rows, n is None)


def _unique2(x, sorted=True, return_inverse=False, return_counts=False, rows=None):
    n = x.numel() if rows is None else rows
    return (_empty((n,), x.dtype), _empty(x.shape if return_inverse else (0,), torch.long),
            _empty((n,) if return_counts else (0,), torch.long))


@rule(Stage.SIZES, aten_op("_unique2"), aten_op("unique_consecutive"), aten_op("_unique"), aten_op("unique_dim"),
      aten_op("unique_dim_consecutive"), source="aten/src/ATen/native/cuda/Unique.cu")
def unique(func, args, kwargs, known, shape_rule):
    """Every element distinct (the upper bound: nothing the program fixes tells how many repeat)."""
    name, x = func.__name__.split(".")[0], args[0]
    if name in ("unique_dim", "unique_dim_consecutive"):
        dim, at = _arg(args, kwargs, 1, "dim"), 3 if name == "unique_dim" else 2   # unique_dim has `sorted`
        inverse = _arg(args, kwargs, at, "return_inverse", False)
        counts = _arg(args, kwargs, at + 1, "return_counts", False)
        n = x.shape[dim]
        out = (_empty(x.shape, x.dtype), _empty((n,) if inverse else (0,), torch.long),
               _empty((n,) if counts else (0,), torch.long))
        return Sized(out, "unique(dim=): every slice distinct", n, True)
    at_most = known.distinct_values(x) if known is not None else None
    rows = at_most if at_most is not None and at_most < x.numel() else x.numel()
    if name == "unique_consecutive":
        out = _unique2(x, True, _arg(args, kwargs, 1, "return_inverse", False), _arg(args, kwargs, 2, "return_counts", False),
                       rows=rows)
    elif name == "_unique":
        out = _unique2(x, True, _arg(args, kwargs, 2, "return_inverse", False), rows=rows)[:2]
    else:
        out = _unique2(x, *args[1:4], **kwargs, rows=rows)
    what = "every element distinct" if rows == x.numel() else "at most the different values its input can hold"
    return Sized(out, f"unique(): {what}", rows, True)


@rule(Stage.SIZES, aten_op("_ctc_loss"), source="aten/src/ATen/native/cuda/LossCTC.cu")
def ctc_loss(func, args, kwargs, known, shape_rule):
    """(negative log likelihood [B], log_alpha [B, T, 2 * max target length + 1]): the longest
    target from the lengths where they are numbers, else the padded targets' width (or all of the
    concatenated targets), the upper bound."""
    log_probs, targets, lengths = args[0], args[1], _arg(args, kwargs, 3, "target_lengths")
    batch, steps = log_probs.shape[1] if log_probs.dim() == 3 else 1, log_probs.shape[0]
    fixed = not isinstance(lengths, torch.Tensor)
    longest = max(lengths, default=0) if fixed else (targets.shape[1] if targets.dim() == 2 else targets.numel())
    out = (_empty((batch,) if log_probs.dim() == 3 else (), log_probs.dtype),
           _empty((batch, steps, 2 * longest + 1), log_probs.dtype))
    return Sized(out, "ctc_loss(): the longest target " + ("given" if fixed else "the targets allow"), longest, not fixed)


@rule(Stage.SIZES, aten_op("linalg_lstsq"), source="aten/src/ATen/native/BatchLinearAlgebra.cpp")
def lstsq(func, args, kwargs, known, shape_rule):
    """(solution, residuals, rank, singular values) as CUDA's only driver, gels, gives them: the
    residuals where A is tall (m > n) and of full rank, which only values tell (taken: the upper
    bound); rank and singular values empty."""
    a, b = args[0], args[1]
    vector = b.dim() == a.dim() - 1
    m, n = a.shape[-2], a.shape[-1]
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-1] if vector else b.shape[:-2])
    k = () if vector else (b.shape[-1],)
    out = (_empty((*batch, n, *k), a.dtype), _empty((*batch, *k) if m > n else (0,), a.dtype),
           _empty((0,), torch.long), _empty((0,), a.dtype))
    return Sized(out, "linalg.lstsq(): residuals as for a full-rank A", m, m > n)


@rule(Stage.SIZES, "torchvision::nms", source="torchvision/csrc/ops/cuda/nms_kernel.cu")
def nms(func, args, kwargs, known, shape_rule):
    """torchvision's non-maximum suppression keeps at most every box (the indices of those kept)."""
    n = args[0].shape[0]
    return Sized(_empty((n,), torch.long), "torchvision.ops.nms(): every box kept", n, True)


@rule(Stage.SIZES, aten_op("bincount"), source="aten/src/ATen/native/cuda/SummaryOps.cu")
def bincount(func, args, kwargs, known, shape_rule):
    """max(minlength, max(x) + 1) bins: `minlength` where it is given (the number of classes: the
    values are taken to be below it); no bound without it."""
    x, weights, minlength = args[0], _arg(args, kwargs, 1, "weights"), _arg(args, kwargs, 2, "minlength", 0)
    if not minlength:
        return NO_BOUND
    dtype = torch.long if weights is None else torch.promote_types(weights.dtype, torch.double) \
        if weights.dtype != torch.float else torch.float
    return Sized(_empty((minlength,), dtype), "bincount(): minlength bins (values taken to be below it)",
                 minlength, False)


@rule(Stage.SIZES, aten_op("repeat_interleave.Tensor"), source="aten/src/ATen/native/Repeat.cpp")
def repeat_interleave(func, args, kwargs, known, shape_rule):
    """Tensor repeats with no `output_size`: the sum of the repeats, with no upper bound."""
    return NO_BOUND if _tensor_repeats(args, kwargs) else None


def _tensor_repeats(args, kwargs) -> bool:
    if kwargs.get("output_size") is not None:
        return False
    repeats = args[1] if len(args) > 1 else kwargs.get("repeats", args[0] if len(args) == 1 else None)
    return isinstance(repeats, torch.Tensor) and repeats.device.type == "meta"


@rule(Stage.SIZES, aten_op("one_hot"), source="aten/src/ATen/native/Onehot.cpp")
def one_hot(func, args, kwargs, known, shape_rule):
    """num_classes=-1 infers max(x) + 1 classes: no bound where x is unknown."""
    classes = _arg(args, kwargs, 1, "num_classes", -1)
    if classes != -1 or (known is not None and known.value(args[0]) is not None):
        return None
    return NO_BOUND


def _histc_on_cpu(x, bins=100, min=0, max=0):   # noqa: A002 (torch's names)
    """histc of an integer tensor, as CUDA computes it (the CPU kernel takes floating inputs only)."""
    return torch.histc(x.double(), bins, min, max).to(x.dtype)


CPU_KERNELS = {aten_op("histc.default"): _histc_on_cpu}   # known values: ops CUDA runs that the CPU refuses


_CHECKS = {bool_index: _bool_indices, repeat_interleave: _tensor_repeats,
           one_hot: lambda args, kwargs: _arg(args, kwargs, 1, "num_classes", -1) == -1}


# ============================================================================ 3: assumed values
def _assume(t, value: torch.Tensor, alt: torch.Tensor | None) -> tuple:
    return ("assume", t, value, alt)


def _rows_first(shape, dim: int, k: int, fill) -> torch.Tensor:
    """A [*shape] int64 tensor whose slices along `dim` (length k) are fill(row_index, position)."""
    dim = dim % len(shape) if shape else 0
    moved = list(shape[:dim]) + list(shape[dim + 1:]) + [k]
    rows = math.prod(moved[:-1])
    r = torch.arange(rows, device="cpu").unsqueeze(1)
    j = torch.arange(k, device="cpu").unsqueeze(0)
    return fill(r, j).expand(rows, k).reshape(moved).movedim(-1, dim).contiguous()


def _routing(shape, dim: int, k: int, n: int, shape_rule: str) -> torch.Tensor:
    """Row r's k choices of n (the module's note): balanced, or skewed with every choice used."""
    if shape_rule == EXPECTED:
        return _rows_first(shape, dim, k, lambda r, j: (r * k + j) % n)
    return _rows_first(shape, dim, k, lambda r, j: torch.where((j == k - 1) & (r < n - k), k + r, j))


def _both(make, shape_rule: str) -> tuple:
    return make(shape_rule), make(other(shape_rule))


@rule(Stage.VALUES, aten_op("topk"), source="aten/src/ATen/native/cuda/TensorTopK.cu")
def topk(func, args, kwargs, out, known, shape_rule):
    """A router's choice of k of n: distinct indices per row, balanced (expected) or the same k for
    every row (upper)."""
    if shape_rule is None:
        return []
    x, k, dim = args[0], _arg(args, kwargs, 1, "k"), _arg(args, kwargs, 2, "dim", -1)
    indices = out[1]
    if x.dim() == 0:
        zero = torch.zeros((), dtype=torch.long, device="cpu")
        return [_assume(indices, zero, zero.clone())]
    n = x.shape[dim]
    value, alt = _both(lambda r: _routing(tuple(indices.shape), dim, k, n, r), shape_rule)
    return [_assume(indices, value, alt)]


@rule(Stage.VALUES, aten_op("max.dim"), aten_op("min.dim"), aten_op("argmax"), aten_op("argmin"),
      source="aten/src/ATen/native/ReduceOps.cpp")
def top1(func, args, kwargs, out, known, shape_rule):
    """A top-1 choice over a dim: spread evenly (expected) or always the first (upper)."""
    if shape_rule is None:
        return []
    x, dim = args[0], _arg(args, kwargs, 1, "dim")
    indices = out[1] if isinstance(out, tuple) else out
    keepdim = _arg(args, kwargs, 2, "keepdim", False)
    if dim is None or x.dim() == 0:
        zero = torch.zeros(tuple(indices.shape), dtype=torch.long, device="cpu")
        return [_assume(indices, zero, zero)]
    n = x.shape[dim]
    shape = tuple(indices.shape) if keepdim else tuple(indices.shape[:dim % x.dim()]) + (1,) + \
        tuple(indices.shape[dim % x.dim():])
    make = lambda r: _routing(shape, dim % x.dim(), 1, n, r).reshape(tuple(indices.shape))  # noqa: E731
    value, alt = _both(make, shape_rule)
    return [_assume(indices, value, alt)]


@rule(Stage.VALUES, aten_op("sort"), source="aten/src/ATen/native/cuda/Sort.cpp")
def sort(func, args, kwargs, out, known, shape_rule):
    """The permutation that sorts: the identity (any permutation gives the same sizes after)."""
    if shape_rule is None:
        return []
    x, indices = args[0], out[1]
    dim = kwargs.get("dim", args[1] if len(args) > 1 and not isinstance(args[1], bool) else
                     args[2] if len(args) > 2 and isinstance(args[1], bool) else -1)
    if x.dim() == 0:
        zero = torch.zeros((), dtype=torch.long, device="cpu")
        return [_assume(indices, zero, zero)]
    n = x.shape[dim]
    value = _rows_first(tuple(indices.shape), dim, n, lambda r, j: j + 0 * r)
    return [_assume(indices, value, value)]


@rule(Stage.VALUES, aten_op("randperm"), source="aten/src/ATen/native/cuda/Randperm.cu")
def randperm(func, args, kwargs, out, known, shape_rule):
    """A random permutation: the identity (`randperm(n)[:k]` is k distinct indices either way)."""
    if shape_rule is None or not isinstance(out, torch.Tensor):
        return []
    value = torch.arange(out.numel(), dtype=out.dtype, device="cpu")
    return [_assume(out, value, value)]


@rule(Stage.VALUES, aten_op("all"), aten_op("_is_all_true"), source="aten/src/ATen/native/ReduceOps.cpp")
def every(func, args, kwargs, out, known, shape_rule):
    """A check that every element holds (a distribution's support, `assert (x >= 0).all()`) holds,
    as on the GPU where the program works: a zero stand-in failed it (torch.distributions raised
    "found invalid values" at every log_prob), where a zero read makes an `any()` test of a fault
    (a nan, an inf) pass too."""
    if shape_rule is None or not isinstance(out, torch.Tensor):
        return []
    value = torch.ones(tuple(out.shape), dtype=torch.bool, device="cpu")
    return [_assume(out, value, value)]


@rule(Stage.VALUES, aten_op("isnan"), aten_op("isinf"), aten_op("isposinf"), aten_op("isneginf"),
      aten_op("eq.Tensor"), aten_op("ne.Tensor"), aten_op("eq.Scalar"), aten_op("ne.Scalar"),
      source="aten/src/ATen/native/TensorCompare.cpp")
def finite(func, args, kwargs, out, known, shape_rule):
    """The values of a program that works on the GPU are numbers: a check for a nan or an inf finds
    none. `isnan`/`isinf` are all False; `isfinite` (torch's composite: `x == x` times
    `x.abs() != inf`) all True, and so `x != x` is all False, a comparison with an infinity as
    with a finite number. A zero stand-in read a finite loss as not finite (ultralytics stopped
    as on a nan, `if not torch.isfinite(loss)`) and skipped steps as GradScaler-style checks do."""
    if shape_rule is None or not isinstance(out, torch.Tensor) or out.dtype != torch.bool:
        return []
    name = func.__name__.split(".")[0]
    if name in ("eq", "ne"):
        other = _arg(args, kwargs, 1, "other")
        infinite = isinstance(other, float) and math.isinf(other)
        if not (other is args[0] or infinite):
            return []
        holds = (name == "eq") == (other is args[0])   # x == x and x != inf hold; x != x and x == inf do not
    else:
        holds = False
    value = torch.full(tuple(out.shape), holds, dtype=torch.bool, device="cpu")
    return [_assume(out, value, value)]


@rule(Stage.VALUES, *(aten_op(n) for n in _INTEGRAL), source="aten/src/ATen/native/UnaryOps.cpp")
def integral(func, args, kwargs, out, known, shape_rule):
    """floor/ceil/round/trunc hold integers: a clamp of them to a small range is a level choice."""
    return [("integral", out)] if isinstance(out, torch.Tensor) else []


@rule(Stage.VALUES, aten_op("clamp.default"), source="aten/src/ATen/native/TensorCompare.cpp")
def clamp(func, args, kwargs, out, known, shape_rule):
    """An integer-valued tensor clamped to [a, b] (an FPN level, LevelMapper): spread evenly over
    a..b (expected), all at a (upper)."""
    x, low, high = args[0], _arg(args, kwargs, 1, "min"), _arg(args, kwargs, 2, "max")
    if shape_rule is None or low is None or high is None or not known.is_integral(x):
        return []
    if int(low) != low or int(high) != high or not 0 <= high - low < MAX_RANGE:
        return []
    span = int(high - low) + 1
    flat = torch.arange(out.numel(), device="cpu")
    make = lambda r: ((flat % span) + int(low) if r == EXPECTED else  # noqa: E731
                      torch.where(flat < span - 1, flat + 1, 0) + int(low)).reshape(tuple(out.shape)).to(out.dtype)
    value, alt = _both(make, shape_rule)
    return [_assume(out, value, alt)]


# ============================================================================ 4: counts
def _nonzero_scalar(v, known) -> bool:
    if isinstance(v, (int, float, bool)):
        return bool(v)
    if not isinstance(v, torch.Tensor) or v.numel() != 1:
        return False
    real = v if v.device.type != "meta" else (known.value(v) if known is not None else None)
    with torch._C.DisableTorchFunction():
        return real is not None and bool(real.reshape(()).item() != 0)


@rule(Stage.VALUES, aten_op("index_put_"), aten_op("index_put"), source="aten/src/ATen/native/TensorAdvancedIndexing.cpp")
def index_put(func, args, kwargs, out, known, shape_rule):
    """mask[idx] = 1 on a mask with c nonzero elements: c + len(idx) (at most every element)."""
    target, indices, value = args[0], args[1], _arg(args, kwargs, 2, "values")
    if _arg(args, kwargs, 3, "accumulate", False) or not _nonzero_scalar(value, known):
        return []
    chosen = [i for i in indices if i is not None]
    if len(chosen) != 1 or len(indices) != 1 or target.dim() != 1:
        return []
    idx = chosen[0]
    n = known.count(idx) if idx.dtype in (torch.bool, torch.uint8) else idx.numel()
    before = known.count(target)
    if n is None or before is None:
        return []
    result = out if isinstance(out, torch.Tensor) else target
    return [("count", result, min(before + n, target.numel()))]


@rule(Stage.VALUES, aten_op("bitwise_or.Tensor"), aten_op("logical_or"), source="aten/src/ATen/native/BinaryOps.cpp")
def either(func, args, kwargs, out, known, shape_rule):
    a, b = args[0], args[1]
    if not (isinstance(b, torch.Tensor) and tuple(a.shape) == tuple(b.shape) == tuple(out.shape)):
        return []
    ca, cb = known.count(a), known.count(b)
    return [] if ca is None or cb is None else [("count", out, min(ca + cb, out.numel()))]


@rule(Stage.VALUES, aten_op("cat"), source="aten/src/ATen/native/TensorShape.cpp")
def cat(func, args, kwargs, out, known, shape_rule):
    counts = [known.count(t) for t in args[0] if isinstance(t, torch.Tensor) and t.numel()]
    return [] if any(c is None for c in counts) else [("count", out, sum(counts))]


@rule(Stage.VALUES, aten_op("_to_copy"), aten_op("clone"), source="aten/src/ATen/native/Copy.cpp")
def copy(func, args, kwargs, out, known, shape_rule):
    x = args[0]
    if x.dtype.is_floating_point or x.dtype.is_complex or not isinstance(out, torch.Tensor):
        return []
    n, distinct = known.count(x), known.distinct_values(x)
    return ([] if n is None else [("count", out, n)]) + ([] if distinct is None else [("distinct", out, distinct)])


@rule(Stage.VALUES, aten_op("randint"), source="aten/src/ATen/native/TensorFactories.cpp")
def randint(func, args, kwargs, out, known, shape_rule):
    """Random integers in [low, high) hold at most high - low different values."""
    low, high = (args[0], args[1]) if func.__name__.split(".")[1].startswith("low") else (0, args[0])
    if not isinstance(out, torch.Tensor) or not isinstance(low, int) or not isinstance(high, int):
        return []
    return [("distinct", out, max(high - low, 0))] if high - low < out.numel() else []


@rule(Stage.VALUES, aten_op("index.Tensor"), aten_op("index_select"), aten_op("gather"), aten_op("take"),
      aten_op("_unsafe_index.Tensor"), source="aten/src/ATen/native/TensorAdvancedIndexing.cpp")
def picked(func, args, kwargs, out, known, shape_rule):
    """Elements picked from a tensor that holds few different values (class labels made by
    `arange`, picked by the boxes a score threshold keeps) hold no others: a `unique()` of them
    has at most that many (torchvision's batched_nms loops over them, once per class)."""
    source = args[0]
    if source.dtype.is_floating_point or source.dtype.is_complex or not isinstance(out, torch.Tensor):
        return []
    n = known.distinct_values(source)
    return [] if n is None or n >= out.numel() else [("distinct", out, n)]
