"""Runs one graph of a compiled region on the session's fake tensors: inductor's wrapper replayed
(inductor_replay.py) when it was generated, else the partitioned FX graph op by op (each op
allocates its output; FX frees each value after its last use).

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


class GraphRunner:
    def __init__(self, session):
        self.session = session

    def run(self, graph, inputs: list) -> list:
        with torch.autocast("cuda", enabled=False):
            if graph.wrapper is not None and getattr(graph, "replay", None) is not None:
                return list(graph.replay(inputs))
            if not getattr(graph, "prepared", False):
                _fake_factories(graph.gm)
                graph.prepared = True
            return list(graph.gm(*inputs))
