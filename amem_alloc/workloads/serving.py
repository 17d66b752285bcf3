"""LLM serving with continuous batching: a batch that changes size every step, and per-request
key/value caches that grow by one token per step and are freed when their request finishes.

Requests arrive at random (seeded), each with its own prompt length and number of tokens to
generate. Every step, the newly arrived requests are prefilled (one forward pass over the prompt,
which creates their caches), then every active request decodes one token in one batch: the
projections and MLPs run batched over the active requests (a batch whose size changes every
step), attention runs per request against its own cache, which grows through torch.cat as in
plain Hugging Face-style generation (every step frees each old cache and allocates one a token
longer). A request that has generated its tokens leaves the batch and its caches are freed. The
many caches of different, growing lengths freed in arrival-unrelated order are what leave a
caching allocator holes that fit nothing.

A decoder of 4 layers (width 256*size, 4 heads, vocabulary 4096), greedy decoding under
torch.no_grad(); prompts of 16-128 tokens (times size), 4-40 generated tokens, 0-3 arrivals per
step (0.75 on average, in bursts), at most 24 requests in the batch. A step is one decoding step
(default 32).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable

LAYERS = 4
HEADS = 4
VOCAB = 4096
MAX_BATCH = 24
ARRIVALS = (0, 1, 2, 3)         # requests arriving per step ...
ARRIVAL_WEIGHTS = (5, 3, 1.5, 0.5)  # ... and how likely each count is


@dataclass
class _Request:
    prompt: int
    to_generate: int
    generated: int = 0
    caches: list = field(default_factory=list)  # per layer: (k, v), each (1, heads, length, head_dim)
    last: object = None                         # the last token, (1,)

    @property
    def length(self) -> int:
        return self.prompt + self.generated


def _model(width: int):
    from torch import nn

    emb = nn.Embedding(VOCAB, width)
    blocks = nn.ModuleList(nn.ModuleDict({"ln": nn.LayerNorm(width), "qkv": nn.Linear(width, 3 * width),
                                          "proj": nn.Linear(width, width),
                                          "mlp": nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 4 * width),
                                                               nn.GELU(), nn.Linear(4 * width, width))})
                           for _ in range(LAYERS))
    return emb, blocks


def _prefill(emb, blocks, req: _Request, tokens) -> None:
    """One forward pass over the prompt; fills the request's caches and its first token."""
    import torch.nn.functional as F

    x = emb(tokens)  # (1, prompt, width)
    _, t, width = x.shape
    for blk in blocks:
        q, k, v = blk["qkv"](blk["ln"](x)).view(1, t, 3, HEADS, width // HEADS).permute(2, 0, 3, 1, 4)
        req.caches.append((k.contiguous(), v.contiguous()))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + blk["proj"](att.transpose(1, 2).reshape(1, t, width))
        x = x + blk["mlp"](x)
    req.last = (x[:, -1] @ emb.weight.T).argmax(-1)


def _decode(emb, blocks, batch: list[_Request]) -> None:
    """One token for every request in the batch: batched projections, attention per request."""
    import torch
    import torch.nn.functional as F

    x = emb(torch.cat([r.last for r in batch]))[:, None, :]  # (batch, 1, width)
    b, _, width = x.shape
    for layer, blk in enumerate(blocks):
        q, k, v = blk["qkv"](blk["ln"](x)).view(b, 1, 3, HEADS, width // HEADS).permute(2, 0, 3, 1, 4)
        outs = []
        for i, req in enumerate(batch):
            old_k, old_v = req.caches[layer]
            kc, vc = torch.cat([old_k, k[i:i + 1]], dim=2), torch.cat([old_v, v[i:i + 1]], dim=2)
            req.caches[layer] = (kc, vc)  # the old cache is freed here
            del old_k, old_v
            outs.append(F.scaled_dot_product_attention(q[i:i + 1], kc, vc))
        att = torch.cat(outs)
        del outs
        x = x + blk["proj"](att.transpose(1, 2).reshape(b, 1, width))
        x = x + blk["mlp"](x)
    nxt = (x[:, -1] @ emb.weight.T).argmax(-1)
    for i, req in enumerate(batch):
        req.last = nxt[i:i + 1].clone()
        req.generated += 1


def kv_bytes(requests: list[_Request], width: int) -> int:
    """Bytes in the active requests' caches (float32 keys and values, every layer)."""
    return sum(2 * LAYERS * r.length * width * 4 for r in requests)


def run(size: int = 1, steps: int | None = None, device: str = "cpu", seed: int = 0,
        on_step: Callable[[int], None] | None = None) -> dict:
    """Serves for `steps` decoding steps; calls on_step(i) after each. Returns the batch size and
    the bytes of key/value cache after each step, and how many requests finished."""
    import torch

    torch.manual_seed(seed)
    rng = random.Random(seed)
    width = 256 * size
    emb, blocks = _model(width)
    emb, blocks = emb.to(device).eval(), blocks.to(device).eval()
    steps = 32 if steps is None else steps
    active: list[_Request] = []
    batch_sizes, kv, finished = [], [], 0
    with torch.no_grad():
        for i in range(steps):
            for _ in range(rng.choices(ARRIVALS, ARRIVAL_WEIGHTS)[0] if i else 4):  # a few requests waiting at the start
                if len(active) == MAX_BATCH:
                    break
                req = _Request(rng.randint(16, 128) * size, rng.randint(4, 40))
                _prefill(emb, blocks, req, torch.randint(VOCAB, (1, req.prompt), device=device))
                active.append(req)
            if active:
                _decode(emb, blocks, active)
            batch_sizes.append(len(active))
            done = [r for r in active if r.generated >= r.to_generate]
            active = [r for r in active if r.generated < r.to_generate]
            finished += len(done)
            del done  # their caches are freed
            kv.append(kv_bytes(active, width))
            if on_step:
                on_step(i)
    return {"steps": steps, "width": width, "layers": LAYERS, "batch_sizes": batch_sizes, "kv_bytes": kv,
            "finished": finished}
