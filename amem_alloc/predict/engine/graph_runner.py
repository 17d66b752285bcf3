"""Runs one graph of a compiled region on the session's fake tensors: inductor's wrapper replayed
(inductor_replay.py) when it was generated, else the partitioned FX graph op by op (each op
allocates its output; FX frees each value after its last use).

A backward graph's incoming gradients are first laid out as the trace laid out its tangents, as
AOTAutograd's backward does (a copy where they differ).

The graph's casts are explicit (AOTAutograd traced them under autocast), so autocast is off while
it runs, as it is inside inductor's compiled code. Its factories name the CUDA device: they make
the session's fake CUDA tensors instead (as the device mode's factories do).
"""
from __future__ import annotations

import torch

from .devices import META, OnDevice


def _on_cuda(target):
    def run(*args, **kwargs):
        with OnDevice("cuda"):
            return target(*args, **{**kwargs, "device": META})
    run.__name__ = f"fake_cuda_{getattr(target, '__name__', 'op').replace('.', '_')}"
    return run


def _is_cuda(device) -> bool:
    return isinstance(device, torch.device) and device.type == "cuda"


def _device_as_keyword(node) -> None:
    """A CUDA device passed by position (inductor's random seeds: `inductor_seeds(count, device)`,
    from its decomposition of dropout) moved to the keywords, with the arguments after it."""
    schema = getattr(node.target, "_schema", None)
    at = next((i for i, a in enumerate(node.args) if _is_cuda(a)), None)
    if schema is None or at is None:
        return
    names = [a.name for a in schema.arguments]
    node.kwargs = {**node.kwargs, **dict(zip(names[at:], node.args[at:]))}
    node.args = node.args[:at]


def _fake_factories(gm):
    """The graph with every op that asks for a CUDA device made to make a fake CUDA tensor."""
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        _device_as_keyword(node)
        if _is_cuda(node.kwargs.get("device")):
            node.target = _on_cuda(node.target)
            node.kwargs = {k: v for k, v in node.kwargs.items() if k != "device"}
    gm.recompile()
    return gm


# ============================================================================ backward's tangents
def _expected_layouts(graph) -> dict:
    """Per backward input that is a tangent: the traced tangent's layout, which AOTAutograd's
    backward coerces the incoming gradient to (`process_runtime_tangent`)."""
    layouts = getattr(graph, "tangent_layouts", None)
    if layouts is None:
        placeholders = [n for n in graph.gm.graph.nodes if n.op == "placeholder"]
        layouts = graph.tangent_layouts = {
            i: _layout(n.meta["val"]) for i, n in enumerate(placeholders)
            if n.name.startswith("tangents") and isinstance(n.meta.get("val"), torch.Tensor)}
    return layouts


def _layout(val: torch.Tensor) -> tuple:
    fmt = torch._prims_common.suggest_memory_format(val)
    return (fmt, None) if val.is_contiguous(memory_format=fmt) else (None, val.stride())


def _as_traced(t, layout: tuple):
    """`coerce_to_expected_memory_format`: a gradient not laid out as traced (an expanded one: a
    sum's) is copied into that layout, as torch copies it; one that is, passes as it is."""
    fmt, stride = layout
    if not isinstance(t, torch.Tensor):
        return t
    if fmt is not None:
        return t if t.is_contiguous(memory_format=fmt) else t.contiguous(memory_format=fmt)
    if t.stride() == stride:
        return t
    return torch.empty_strided(t.shape, stride, dtype=t.dtype, device=t.device).copy_(t)


class GraphRunner:
    def __init__(self, session):
        self.session = session

    def run(self, graph, inputs: list) -> list:
        if graph.is_backward:
            for i, layout in _expected_layouts(graph).items():
                inputs[i] = _as_traced(inputs[i], layout)
        with torch.autocast("cuda", enabled=False):
            if graph.replay is not None:
                return list(graph.replay(inputs))
            if not getattr(graph, "prepared", False):
                _fake_factories(graph.gm)
                graph.prepared = True
            return list(graph.gm(*inputs))
