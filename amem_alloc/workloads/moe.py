"""Mixture-of-experts training: each expert gets a different number of tokens every step.

A token router (top-1 gating) sends each token to one of 8 expert MLPs; each expert runs on the
tokens routed to it, so the size of every expert's input, hidden activations and their gradients
changes from step to step and from expert to expert. That stream of ever-new shapes is what
leaves a caching allocator's cached blocks a poor fit. The routing is made skewed and changing
on purpose (seeded): each step and block draws a per-expert popularity on the host and routes
the tokens by it (the router's softmax still weights each expert's output, so it trains), as
load imbalance does in real MoE training; the counts are far from equal and every shape is known
without reading a device value.

The model: embedding-free blocks of layer norm -> router -> experts (width -> 4*width -> width,
GELU) -> weighted residual, 2 blocks, AdamW. `size` scales the width (128*size) and the tokens
per step (512*size).
"""
from __future__ import annotations

import random
from typing import Callable

EXPERTS = 8
BLOCKS = 2


def _model(width: int):
    import torch
    from torch import nn

    class MoE(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln = nn.LayerNorm(width)
            self.router = nn.Linear(width, EXPERTS, bias=False)
            self.experts = nn.ModuleList(nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                                       nn.Linear(4 * width, width)) for _ in range(EXPERTS))

        def forward(self, x: torch.Tensor, routes: list[list[int]]) -> torch.Tensor:
            """routes[e]: the tokens sent to expert e (in dispatch order)."""
            h = self.ln(x)
            probs = torch.softmax(self.router(h), dim=-1)
            out = torch.zeros_like(x)
            for e, tokens in enumerate(routes):
                if tokens:
                    idx = torch.tensor(tokens, device=x.device)
                    y = self.experts[e](h[idx]) * probs[idx, e, None]  # the gate weights train the router
                    out = out.index_add(0, idx, y)
            return x + out

    return nn.ModuleList(MoE() for _ in range(BLOCKS))


def route(rng: random.Random, tokens: int) -> list[list[int]]:
    """Each token's expert, drawn from this step's skewed expert popularity (seeded); the
    tokens of each expert, as a top-1 router with load imbalance would send them. Drawn on the
    host, so the shapes never depend on a device value."""
    popularity = [rng.expovariate(1.0) ** 2 + 1e-3 for _ in range(EXPERTS)]
    routes: list[list[int]] = [[] for _ in range(EXPERTS)]
    for t, e in enumerate(rng.choices(range(EXPERTS), weights=popularity, k=tokens)):
        routes[e].append(t)
    return routes


def run(size: int = 1, steps: int | None = None, device: str = "cpu", seed: int = 0,
        on_step: Callable[[int], None] | None = None) -> dict:
    """Trains for `steps` steps (default 4); calls on_step(i) after each. Returns the tokens each
    expert got in each block at each step."""
    import torch

    torch.manual_seed(seed)
    rng = random.Random(seed)
    width, tokens = 128 * size, 512 * size
    blocks = _model(width).to(device)
    opt = torch.optim.AdamW(blocks.parameters(), lr=1e-3)
    steps = 4 if steps is None else steps
    counts = []  # [step][block][expert]
    for i in range(steps):
        x = torch.randn(tokens, width, device=device)
        step_counts = []
        for block in blocks:
            routes = route(rng, tokens)
            step_counts.append([len(r) for r in routes])
            x = block(x, routes)
        x.square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        counts.append(step_counts)
        del x
        if on_step:
            on_step(i)
    return {"steps": steps, "width": width, "tokens": tokens, "experts": EXPERTS, "tokens_per_expert": counts}
