"""A DeepSeek-style mixture-of-experts language model written against torch: each layer's MoE has
shared experts that see every token and routed experts of which each token takes the top k by a
sigmoid gate, run per expert as DeepSeek-V3's reference model runs them (a bincount of the chosen
experts read on the host, then a loop over the experts that got tokens, torch.where per expert).
Token embedding, pre-norm residual MoE layers (RMSNorm), a head, cross-entropy; fp32, AdamW."""
import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn


class Expert(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim, inter):
        super().__init__()
        self.w1, self.w2, self.w3 = nn.Linear(dim, inter, bias=False), nn.Linear(inter, dim, bias=False), \
            nn.Linear(dim, inter, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Gate(nn.Module):
    def __init__(self, dim, experts, topk):
        super().__init__()
        self.topk = topk
        self.weight = nn.Parameter(torch.randn(experts, dim) * dim ** -0.5)

    def forward(self, x):
        scores = F.linear(x, self.weight).sigmoid()
        indices = torch.topk(scores, self.topk, dim=-1)[1]
        weights = scores.gather(1, indices)
        return weights / weights.sum(dim=-1, keepdim=True), indices


class MoE(nn.Module):
    def __init__(self, dim, inter, experts, topk, shared):
        super().__init__()
        self.dim, self.n_routed = dim, experts
        self.gate = Gate(dim, experts, topk)
        self.experts = nn.ModuleList(Expert(dim, inter) for _ in range(experts))
        self.shared_experts = Expert(dim, shared * inter)

    def forward(self, x):
        shape = x.size()
        x = x.view(-1, self.dim)
        weights, indices = self.gate(x)
        y = torch.zeros_like(x)
        counts = torch.bincount(indices.flatten(), minlength=self.n_routed).tolist()
        for i in range(self.n_routed):
            if counts[i] == 0:
                continue
            idx, top = torch.where(indices == i)
            y[idx] += self.experts[i](x[idx]) * weights[idx, top, None]
        z = self.shared_experts(x)
        return (y + z).view(shape)


class Model(nn.Module):
    def __init__(self, vocab, dim, inter, layers, experts, topk, shared):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.norms = nn.ModuleList(nn.RMSNorm(dim) for _ in range(layers))
        self.moes = nn.ModuleList(MoE(dim, inter, experts, topk, shared) for _ in range(layers))
        self.norm = nn.RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for norm, moe in zip(self.norms, self.moes):
            x = x + moe(norm(x))
        return self.head(self.norm(x))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--inter", type=int, default=512)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--topk", type=int, default=2)
    parser.add_argument("--shared", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()

    model = Model(args.vocab, args.dim, args.inter, args.layers, args.experts, args.topk, args.shared).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    print(f"parameters: {sum(p.numel() for p in model.parameters()):,}")
    for step in range(args.steps):
        t0 = time.time()
        tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), device=args.device)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step}: loss {loss.item():.4f} ({(time.time() - t0) * 1000:.0f} ms)")


if __name__ == "__main__":
    main()
