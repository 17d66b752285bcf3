"""A GPT-style decoder trained with a different random sequence length each step.

Varying shapes are what make a caching allocator fragment: each step's activations have other
sizes than the last step's, so cached blocks fit badly. The model is a plain pre-norm decoder
(token and position embeddings, causal self-attention, a 4x MLP, tied output head) trained with
AdamW. `size` scales it: width 128*size, 2*size layers, 4*size heads, sequences of up to
128*size tokens, batch 8. size=1 runs a step in a few tens of milliseconds on a CPU.
"""
from __future__ import annotations

import random
from typing import Callable

DEFAULT_STEPS = 6


def _model(width: int, layers: int, heads: int, vocab: int, max_seq: int):
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, width // heads).permute(2, 0, 3, 1, 4)
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(att.transpose(1, 2).reshape(b, t, width))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(max_seq, width)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(width)

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            for block in self.blocks:
                x = block(x)
            return self.ln(x) @ self.tok.weight.T  # tied head

    return GPT()


def run(size: int = 1, steps: int | None = None, device: str = "cpu", seed: int = 0,
        on_step: Callable[[int], None] | None = None) -> dict:
    """Trains for `steps` steps; calls on_step(i) after each. Returns what ran."""
    import torch
    from torch.nn import functional as F

    torch.manual_seed(seed)
    rng = random.Random(seed)
    width, layers, heads, max_seq, batch, vocab = 128 * size, 2 * size, 4 * size, 128 * size, 8, 2048
    model = _model(width, layers, heads, vocab, max_seq).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    steps = DEFAULT_STEPS if steps is None else steps
    lengths = []
    for i in range(steps):
        t = rng.randrange(max_seq // 4, max_seq + 1)
        lengths.append(t)
        tokens = torch.randint(vocab, (batch, t + 1), device=device)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del tokens, logits, loss
        if on_step:
            on_step(i)
    return {"steps": steps, "width": width, "layers": layers, "batch": batch, "sequence_lengths": lengths}
