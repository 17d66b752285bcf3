"""Autoregressive decoding with a growing key/value cache.

A small decoder generates tokens one at a time (greedy, no grad). Each layer's key and value
caches grow by one position per token through torch.cat, the way simple inference code does it:
every step frees the old cache and allocates one a little larger, a pattern that leaves a
caching allocator a trail of blocks just too small for the next request. Each generated token
is a step. `size` scales the width (128*size), the prompt (16*size tokens) and the number of
generated tokens (32*size); 2 layers, batch 4.
"""
from __future__ import annotations

from typing import Callable


def _layers(width: int, layers: int, vocab: int):
    from torch import nn

    emb = nn.Embedding(vocab, width)
    blocks = nn.ModuleList(nn.ModuleDict({"ln": nn.LayerNorm(width), "qkv": nn.Linear(width, 3 * width),
                                          "proj": nn.Linear(width, width),
                                          "mlp": nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                                               nn.Linear(4 * width, width))})
                           for _ in range(layers))
    return emb, blocks


def _forward(emb, blocks, tokens, cache: list, heads: int):
    """One forward pass over `tokens` (the prompt, or one new token), extending the caches."""
    import torch
    from torch.nn import functional as F

    x = emb(tokens)
    b, t, width = x.shape
    for i, blk in enumerate(blocks):
        q, k, v = blk["qkv"](blk["ln"](x)).view(b, t, 3, heads, width // heads).permute(2, 0, 3, 1, 4)
        if cache[i] is not None:
            k, v = torch.cat([cache[i][0], k], dim=2), torch.cat([cache[i][1], v], dim=2)
        cache[i] = (k, v)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=cache[i][0].shape[2] == t)
        x = x + blk["proj"](att.transpose(1, 2).reshape(b, t, width))
        x = x + blk["mlp"](x)
    return x[:, -1] @ emb.weight.T


def run(size: int = 1, steps: int | None = None, device: str = "cpu", seed: int = 0,
        on_step: Callable[[int], None] | None = None) -> dict:
    """Generates `steps` tokens (default 32*size) after a prompt; calls on_step(i) after each."""
    import torch

    torch.manual_seed(seed)
    width, layers, heads, batch, vocab = 128 * size, 2, 4, 4, 2048
    emb, blocks = _layers(width, layers, vocab)
    emb, blocks = emb.to(device), blocks.to(device)
    steps = 32 * size if steps is None else steps
    cache: list = [None] * layers
    with torch.no_grad():
        tokens = torch.randint(vocab, (batch, 16 * size), device=device)
        logits = _forward(emb, blocks, tokens, cache, heads)
        for i in range(steps):
            nxt = logits.argmax(-1, keepdim=True)
            logits = _forward(emb, blocks, nxt, cache, heads)
            if on_step:
                on_step(i)
    return {"steps": steps, "width": width, "layers": layers, "batch": batch, "prompt": 16 * size}
