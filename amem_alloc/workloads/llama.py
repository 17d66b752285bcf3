"""A LLaMA-style 7-billion-parameter decoder trained with AdamW under bf16 autocast.

The shape of LLaMA-7B: 32 layers, d_model 4096, 32 heads, SwiGLU MLP with d_ff 11008, RMSNorm,
rotary position embeddings, no biases, an untied output head, vocabulary 32000; sequences of
2048 tokens. Weights and AdamW's state are fp32 (mixed precision: autocast casts the weights to
bf16 for each matmul), attention is scaled_dot_product_attention (causal). `size` is the batch
(default 1). About 6.7e9 parameters: weights, gradients and Adam's two moments alone take
~108 GB, so a training step does not fit an 80 GB card; it is the case `amem predict` exists for
(nothing runs: the prediction only records the allocations). `config=` takes a smaller
LlamaConfig for quick checks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

DEFAULT_STEPS = 2


@dataclass(frozen=True)
class LlamaConfig:
    layers: int = 32
    d_model: int = 4096
    heads: int = 32
    d_ff: int = 11008
    vocab: int = 32000
    seq: int = 2048

    @property
    def parameters(self) -> int:
        per_layer = 4 * self.d_model ** 2 + 3 * self.d_model * self.d_ff + 2 * self.d_model
        return self.layers * per_layer + 2 * self.vocab * self.d_model + self.d_model


LLAMA_7B = LlamaConfig()
TINY = LlamaConfig(layers=2, d_model=256, heads=4, d_ff=688, vocab=1000, seq=128)


def _model(cfg: LlamaConfig):
    import torch
    from torch import nn
    from torch.nn import functional as F

    head_dim = cfg.d_model // cfg.heads

    class RMSNorm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(cfg.d_model))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x32 = x.float()
            return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).type_as(x) * self.weight

    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., : head_dim // 2], x[..., head_dim // 2:]
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn_norm, self.mlp_norm = RMSNorm(), RMSNorm()
            self.q, self.k, self.v, self.o = (nn.Linear(cfg.d_model, cfg.d_model, bias=False) for _ in range(4))
            self.gate = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
            self.up = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
            self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

        def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            h = self.attn_norm(x)
            q, k, v = (proj(h).view(b, t, cfg.heads, head_dim).transpose(1, 2) for proj in (self.q, self.k, self.v))
            att = F.scaled_dot_product_attention(rotate(q, cos, sin), rotate(k, cos, sin), v, is_causal=True)
            x = x + self.o(att.transpose(1, 2).reshape(b, t, cfg.d_model))
            h = self.mlp_norm(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    class Llama(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
            self.blocks = nn.ModuleList(Block() for _ in range(cfg.layers))
            self.norm = RMSNorm()
            self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
            inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
            angles = torch.outer(torch.arange(cfg.seq).float(), inv)
            angles = torch.cat((angles, angles), dim=-1)
            self.register_buffer("cos", angles.cos(), persistent=False)
            self.register_buffer("sin", angles.sin(), persistent=False)

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            t = idx.shape[1]
            x = self.embed(idx)
            cos, sin = self.cos[:t], self.sin[:t]
            for block in self.blocks:
                x = block(x, cos, sin)
            return self.head(self.norm(x))

    return Llama()


def run(size: int = 1, steps: int | None = None, device: str = "cpu", seed: int = 0,
        on_step: Callable[[int], None] | None = None, config: LlamaConfig | None = None) -> dict:
    """Trains `steps` steps (default 2) at batch `size`; calls on_step(i) after each."""
    import torch
    from torch.nn import functional as F

    cfg = config or LLAMA_7B
    torch.manual_seed(seed)
    device_type = torch.device(device).type
    with torch.device(device):
        model = _model(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    steps = DEFAULT_STEPS if steps is None else steps
    for i in range(steps):
        tokens = torch.randint(cfg.vocab, (size, cfg.seq + 1), device=device)
        with torch.autocast(device_type, dtype=torch.bfloat16):
            logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().view(-1, cfg.vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del tokens, logits, loss
        if on_step:
            on_step(i)
    return {"steps": steps, "batch": size, "parameters": sum(p.numel() for p in model.parameters()), "layers": cfg.layers,
            "d_model": cfg.d_model, "seq": cfg.seq}
