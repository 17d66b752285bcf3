"""The rule registry: every rule by which fake execution does what CUDA does, keyed by the op it
applies to and the stage at which it applies.

Design note
-----------
A fake CUDA tensor is a meta tensor. Where a meta tensor and a CUDA tensor part ways — a call CUDA
routes to another kernel, a kernel's own temporaries, an output in another memory format, an
in-place update CUDA's autograd engine makes and meta's does not — a *rule* says what CUDA does.
Rules are registered here by decorator, as torch's FakeTensorMode registers its op impls
(`register_op_impl` in torch/_subclasses/fake_impls.py), and the engine looks them up: it has no
op names of its own.

    @rule(Stage.KERNEL, aten.embedding_dense_backward, source="aten/src/ATen/native/cuda/Embedding.cu")
    def dense_backward(args, kwargs, scratch, session): ...

Keys: an aten overload (`aten.add.Tensor`), an overload packet (`aten.convolution`: every
overload), the qualified name of another library's op (`"torchvision::nms"`: no import needed to
register it), or, for the torch-function stage, the name of a torch function (every binding of the
name: `F.dropout`, `torch.dropout`, `_VF.dropout` are one function at that level). Lookup tries the
overload, then its packet, then its qualified name, then its name.

Stages, in the order an op meets them, and what each rule takes and returns:

    FUNCTION      (func, args, kwargs, mode) -> result, or None to let the call run as it is.
                  The torch-function level (engine/device_mode.py), for calls CUDA routes
                  differently from a meta tensor (attention's backends, fused dropout, cuDNN's
                  batch norm).
    AUTOGRAD      (func, args, kwargs, recorder) -> result, or NOT_APPLICABLE. The dispatch level,
                  instead of the op: what CUDA's autograd engine does in place where meta tensors
                  (subclass-like to the engine) take out-of-place branches (rules/autograd.py).
    KERNEL        (args, kwargs, scratch, session) -> None. Before a CUDA op runs: the temporaries
                  its CUDA kernel allocates (scratch.py), freed once the op has run.
    LAYOUT        (args, kwargs, out) -> out. After a CUDA op's meta kernel: the output as CUDA's
                  kernel lays it out (a convolution's channels-last output).
    HOST_INPUTS   (args, kwargs) -> bool. Before a CUDA op: whether the host tensors it is given
                  stay on the host, where its CUDA kernel reads them (a packed sequence's lengths
                  and batch sizes); others are moved onto the fake device.
    HOST_OUTPUTS  (name, args, kwargs) -> positions. After a CUDA op: outputs, by position among
                  its tensor outputs, that CUDA keeps on the host (not device memory).
    SIZES         (func, args, kwargs, known, rule) -> Sized, NO_BOUND, or None when the op's
                  output size does not depend on values this time. An op whose output size
                  depends on its inputs' values, when they are not all known: its output from
                  what the program fixed, or at its upper bound (rules/data_dependent.py).
    VALUES        (func, args, kwargs, out, known, rule) -> facts. After an op whose inputs are not
                  all known: what it still tells of its outputs' values (assumed values of a
                  guaranteed structure, counts of nonzero elements), applied by engine/known.py.

Adding a rule is one decorated function in the module of its concern and one test; the module is
imported by rules/__init__.py, which registers everything at import.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, Iterator


class Stage(enum.Enum):
    FUNCTION = "function"
    AUTOGRAD = "autograd"
    KERNEL = "kernel"
    LAYOUT = "layout"
    HOST_INPUTS = "host inputs"
    HOST_OUTPUTS = "host outputs"
    SIZES = "sizes"
    VALUES = "values"


NOT_APPLICABLE = object()   # an AUTOGRAD rule's answer when its conditions do not hold: the op runs as it is


@dataclass(frozen=True)
class Rule:
    stage: Stage
    key: Any              # an OpOverload, an OpOverloadPacket, or a torch function's name
    fn: Callable[..., Any]
    source: str           # the torch (or library) source the rule follows


_RULES: dict[Stage, dict[Any, Rule]] = {stage: {} for stage in Stage}


def rule(stage: Stage, *keys: Any, source: str = "") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Registers the decorated function for each key at `stage` (a key that is None — an op this
    torch release lacks — is skipped)."""
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        for key in keys:
            if key is None:
                continue
            if key in _RULES[stage]:
                raise ValueError(f"amem: two {stage.value} rules for {key}")
            _RULES[stage][key] = Rule(stage, key, fn, source)
        return fn
    return register


def aten_op(name: str) -> Any:
    """torch.ops.aten's overload or packet `name` ("add.Tensor", "convolution"), or None where this
    torch release has none."""
    import torch

    packet_name, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, packet_name, None)
    if packet is None or not overload:
        return packet
    return getattr(packet, overload, None) if overload in packet.overloads() else None


def _keys_of(func: Any) -> Iterator[Any]:
    yield func
    packet = getattr(func, "overloadpacket", None)
    if packet is not None:
        yield packet
        yield getattr(packet, "_qualified_op_name", None)
        yield packet.__name__
    else:
        yield getattr(func, "__name__", None)


def lookup(stage: Stage, func: Any) -> Rule | None:
    """The rule for `func` at `stage`: the overload's, else its packet's, else its name's."""
    table = _RULES[stage]
    if not table:
        return None
    for key in _keys_of(func):
        try:
            hit = table.get(key)
        except TypeError:   # an unhashable callable
            return None
        if hit is not None:
            return hit
    return None


def rules(stage: Stage | None = None) -> list[Rule]:
    """Every registered rule (of one stage), for docs and tests."""
    stages = [stage] if stage else list(Stage)
    return [r for s in stages for r in _RULES[s].values()]
