"""scaled_dot_product_attention in a compiled region: the kernel the predicted card takes.

`F.scaled_dot_product_attention` is a composite; which kernel it runs is decided when AOTAutograd
traces it (aten/src/ATen/native/transformers/attention.cpp asks the CUDA backend choice,
sdp_utils.cpp `select_sdp_backend`). With no GPU on this machine that choice finds no card and
takes the math path: the (B, H, T, T) attention weights saved for backward, where an H100 runs
flash attention and saves its output and log-sum-exp (nanoGPT's compiled GPT saved a third more
than torch saves on the card).

So each SDPA call in dynamo's graph is made a call of the function below, which takes the backend
the card would take (rules/sdpa_select.py, torch's choice ported, on the session's platform) and
calls that kernel's aten op, as attention.cpp does; AOTAutograd then traces that op and its
derivative as it would on the card. The math path is left to torch's own composite.
"""
from __future__ import annotations

import torch

_SDPA = (torch._C._nn.scaled_dot_product_attention, torch.nn.functional.scaled_dot_product_attention)
_NAMES = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def on_card(gm: torch.fx.GraphModule, props) -> torch.fx.GraphModule:
    """dynamo's graph with each SDPA call taking the kernel the card takes (`props`: its
    properties, compile_trace.props_of)."""
    plat = _platform(props)
    changed = False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _SDPA:
            node.target = _bound(plat)
            changed = True
    if changed:
        gm.recompile()
    return gm


def _bound(plat):
    def scaled_dot_product_attention_on_card(*args, **kwargs):
        return sdpa_on_card(*args, plat=plat, **kwargs)
    return scaled_dot_product_attention_on_card


def _platform(props):
    from ..rules import platform

    return platform.Platform((props.major, props.minor), props.multi_processor_count, *platform.libraries())


def sdpa_on_card(*args, plat, **kwargs):
    from ..rules.attention import dense_inputs, run_backend
    from ..rules.sdpa_select import Params, select

    p = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False,
         **dict(zip(_NAMES, args)), **kwargs}
    q, k, v, mask = p["query"], p["key"], p["value"], p["attn_mask"]
    params = Params(q, k, v, mask, float(p["dropout_p"]), bool(p["is_causal"]), bool(p["enable_gqa"]),
                    torch.is_grad_enabled())
    backend = select(params, plat) if dense_inputs(q, k, v, mask) else "math"
    if backend == "math":
        return torch._C._nn.scaled_dot_product_attention(*args, **kwargs)
    return run_backend(backend, params, p["scale"])
