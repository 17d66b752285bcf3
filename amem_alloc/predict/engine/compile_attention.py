"""`scaled_dot_product_attention` in a compiled region, traced with the kernel the card would run.

On a GPU, AOTAutograd traces SDPA through its C++ composite, which asks the card which kernel to
use (sdp_utils.cpp's `select_sdp_backend`) and records that kernel's op: flash attention's
`_scaled_dot_product_flash_attention` on an H100 in bf16, say, which inductor lowers as a fallback
kernel that saves the output and the logsumexp. Without a GPU the composite finds no card and
records the math path (the scores materialised, then softmax): another graph, other buffers.

So each SDPA call of dynamo's graph is replaced, before AOTAutograd traces it, by the same choice
the eager prediction makes (rules/sdpa_select.py, a port of torch's, for the session's card) and
the op that choice runs (rules/attention.py): what AOTAutograd records on the card.
"""
from __future__ import annotations

import torch

from .. import state

_SDPA = {torch._C._nn.scaled_dot_product_attention, torch.nn.functional.scaled_dot_product_attention}


def as_on_the_card(gm: torch.fx.GraphModule) -> None:
    """Dynamo's graph with each SDPA call made the kernel the session's card would choose."""
    nodes = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in _SDPA]
    current = state.current()
    if not nodes or current is None or current.session is None:
        return
    from ..rules import platform

    run = _chosen(platform.of(current.session))
    for node in nodes:
        node.target = run
    gm.recompile()


def _chosen(plat):
    def sdpa_as_on_the_card(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                            enable_gqa=False):
        from ..rules.attention import _RUN
        from ..rules.sdpa_select import Params, select

        params = Params(query, key, value, attn_mask, float(dropout_p), bool(is_causal), bool(enable_gqa),
                        torch.is_grad_enabled())
        return _RUN[select(params, plat)](params, scale)
    return sdpa_as_on_the_card
